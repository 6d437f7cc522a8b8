//! Column types the row structs read by name (`#[derive(sqlx::FromRow)]` with
//! `#[sqlx(try_from = ...)]`): the schema keeps flags as integers and structured values as JSON
//! text, the same on SQLite and PostgreSQL, which sqlx's `Any` driver does not map by itself.
//! A value that does not decode is a `sqlx::Error::ColumnDecode` naming the column.

use serde::de::DeserializeOwned;
use sqlx::any::{Any, AnyTypeInfo, AnyValueRef};
use sqlx::decode::Decode;
use sqlx::error::BoxDynError;
use sqlx::types::Type;

use gpusanity_common::findings::Code;
use gpusanity_common::wire::job::JobNode;

/// `Type<Any>` and `Decode<Any>` for a column type: the value is read as `$stored` (whose SQL
/// types it accepts) and turned into the column type by `$from`.
macro_rules! column_type {
    ($name:ident $(<$t:ident: $bound:path>)?, $stored:ty, $from:expr) => {
        impl$(<$t: $bound>)? Type<Any> for $name$(<$t>)? {
            fn type_info() -> AnyTypeInfo {
                <$stored as Type<Any>>::type_info()
            }

            fn compatible(ty: &AnyTypeInfo) -> bool {
                <$stored as Type<Any>>::compatible(ty)
            }
        }

        impl<'r $(, $t: $bound)?> Decode<'r, Any> for $name$(<$t>)? {
            fn decode(value: AnyValueRef<'r>) -> Result<Self, BoxDynError> {
                let from: fn($stored) -> Result<Self, BoxDynError> = $from;
                from(<$stored as Decode<'r, Any>>::decode(value)?)
            }
        }
    };
}

/// An integer column read as a flag: 0 is false, anything else true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

column_type!(Flag, i64, |n| Ok(Flag(n != 0)));

impl From<Flag> for bool {
    fn from(f: Flag) -> bool {
        f.0
    }
}

/// A text column holding JSON, parsed into `T` on read.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonText<T>(pub T);

column_type!(JsonText<T: DeserializeOwned>, String, |text| Ok(JsonText(serde_json::from_str(&text)?)));

impl From<JsonText<Vec<JobNode>>> for Vec<JobNode> {
    fn from(j: JsonText<Vec<JobNode>>) -> Self {
        j.0
    }
}

impl From<JsonText<serde_json::Value>> for serde_json::Value {
    fn from(j: JsonText<serde_json::Value>) -> Self {
        j.0
    }
}

/// A text column holding a value of a closed set (`T: FromStr`), parsed once here: a value
/// this version does not know is a `ColumnDecode` error whose text names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed<T>(pub T);

column_type!(Parsed<T: std::str::FromStr>, String, |text| text
    .parse()
    .map(Parsed)
    .map_err(|_| format!("unknown value `{}`", text.escape_debug()).into()));

/// A text column holding a comma-separated list of finding codes (empty items dropped), each
/// parsed: an unknown code is a `ColumnDecode` error naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeList(pub Vec<Code>);

column_type!(CodeList, String, |text| Ok(CodeList(
    text.split(',').filter(|c| !c.is_empty()).map(str::parse).collect::<Result<_, _>>()?
)));

impl From<Parsed<Code>> for Code {
    fn from(p: Parsed<Code>) -> Code {
        p.0
    }
}

impl From<CodeList> for Vec<Code> {
    fn from(l: CodeList) -> Self {
        l.0
    }
}

/// The text a [`CodeList`] column stores.
pub fn code_list(codes: &[Code]) -> String {
    codes.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    #[derive(sqlx::FromRow)]
    struct Probe {
        #[sqlx(try_from = "Flag")]
        flag: bool,
        #[sqlx(try_from = "JsonText<Vec<JobNode>>")]
        nodes: Vec<JobNode>,
    }

    #[tokio::test]
    async fn flags_and_json_read_by_name_and_bad_json_is_a_column_decode_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::Db::connect(&format!("sqlite://{}", dir.path().join("c.db").display())).await.unwrap();
        let nodes = r#"[{"name":"n1","address":"10.0.0.1","gpus":8}]"#;
        let p: Probe = sqlx::query_as("SELECT $1 AS nodes, 7 AS flag").bind(nodes).fetch_one(&db.pool).await.unwrap();
        assert!(p.flag);
        assert_eq!(p.nodes, [JobNode { name: "n1".into(), address: "10.0.0.1".into(), gpus: 8, gpu_ids: Vec::new() }]);
        let p: Probe = sqlx::query_as("SELECT '[]' AS nodes, 0 AS flag").fetch_one(&db.pool).await.unwrap();
        assert!(!p.flag && p.nodes.is_empty());
        let e = sqlx::query_as::<_, Probe>("SELECT '[{' AS nodes, 1 AS flag").fetch_one(&db.pool).await.err().unwrap();
        assert!(matches!(&e, sqlx::Error::ColumnDecode { index, .. } if index.contains("nodes")), "{e:?}");
        assert!(crate::DbError::Sql(e).is_poison());
        // A text where a flag belongs is refused too, not read as false.
        let row = sqlx::query("SELECT 'yes' AS flag").fetch_one(&db.pool).await.unwrap();
        assert!(row.try_get::<Flag, _>("flag").is_err());
        let row = sqlx::query("SELECT 'NO_AGENT,,GEMM_SLOW' AS codes, '' AS empty, 'NO_AGENT,GEMM_SLOWER' AS bad")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(row.try_get::<CodeList, _>("codes").unwrap().0, [Code::NoAgent, Code::GemmSlow]);
        assert!(row.try_get::<CodeList, _>("empty").unwrap().0.is_empty());
        // A code this version does not know is refused, naming it, not dropped.
        let e = row.try_get::<CodeList, _>("bad").unwrap_err();
        assert!(e.to_string().contains("GEMM_SLOWER"), "{e}");
        let row = sqlx::query("SELECT 'GEMM_SLOW' AS code, 'gemm_slow' AS lower").fetch_one(&db.pool).await.unwrap();
        assert_eq!(row.try_get::<Parsed<Code>, _>("code").unwrap().0, Code::GemmSlow);
        let e = row.try_get::<Parsed<Code>, _>("lower").unwrap_err();
        assert!(e.to_string().contains("`gemm_slow`"), "{e}");
    }
}
