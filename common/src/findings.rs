//! Every finding code, declared once with its severity, the checks that raise it, where it
//! is placed, what it means and what to do: [`Code`]. `report.json` spells a code as its
//! `SCREAMING_SNAKE` name (`Finding.code`); the table of docs/findings.md is [`Code::table`],
//! checked by a test. A new code is one entry in the `check_codes!` list of its check's
//! descriptor module, or in `codes.rs` for codes that are not one check's (the test then prints
//! the table to paste into docs/findings.md). [`Code`] itself is gathered with the check
//! descriptors ([`crate::checks`]), from the vocabulary of [`doc`]; its text forms and the
//! findings that carry it are here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::kinds::Severity;
use crate::registry::Scope;

pub(crate) mod codes;
pub mod doc;

pub use crate::checks::Code;
pub use doc::{CodeDoc, Raised};

impl Code {
    /// The findings table of docs/findings.md.
    pub fn table() -> String {
        let mut t =
            String::from("| code | severity | check | placed on | meaning | action |\n|---|---|---|---|---|---|\n");
        for code in Code::ALL {
            let d = code.doc();
            let raised: Vec<&str> = d.raised.iter().map(|r| r.label()).collect();
            t.push_str(&format!(
                "| `{code}` | {} | {} | {} | {} | {} |\n",
                d.severity_text,
                raised.join(", "),
                d.placed,
                d.meaning,
                d.action
            ));
        }
        t
    }
}

/// A string that is no finding code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown finding code `{0}`")]
pub struct UnknownCode(pub String);

impl FromStr for Code {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Code, UnknownCode> {
        Code::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| UnknownCode(s.to_string()))
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Code, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A problem found, with the evidence that names its place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    /// A stable code, listed in docs/findings.md, e.g. `GEMM_SLOW`, `WORKER_CRASHED`.
    pub code: Code,
    /// The check it is about, or `run`, `agent`, `service`.
    pub check: Scope,
    pub node_rank: Option<usize>,
    pub host: Option<String>,
    pub rank: Option<usize>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers_median: Option<f64>,
    /// What a healthy device of this model reaches (common/data/expected.toml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<f64>,
    /// The peers' median absolute deviation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers_mad: Option<f64>,
    /// Robust score: (measured - median) / (1.4826 MAD); very negative is slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The two node ranks of a link finding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<[usize; 2]>,
    /// Facts behind the finding, one per line (last output lines, re-measure, pair figures...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// What to do about it (exclude the node, reset the GPU, inspect the link...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

impl Finding {
    /// A finding about the whole job; set `node_rank`, `host` and `rank` to place it.
    pub fn new(severity: Severity, code: Code, check: impl Into<Scope>, message: String) -> Self {
        Finding {
            severity,
            code,
            check: check.into(),
            node_rank: None,
            host: None,
            rank: None,
            message,
            measured: None,
            peers_median: None,
            expected: None,
            peers_mad: None,
            score: None,
            pair: None,
            evidence: Vec::new(),
            action: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        for (i, code) in Code::ALL.into_iter().enumerate() {
            assert_eq!(code.as_str().parse::<Code>(), Ok(code));
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{code}\""));
            assert!(Code::ALL[..i].iter().all(|c| c.as_str() != code.as_str()), "{code} twice");
            let d = code.doc();
            let worst = if d.severity_text.starts_with("critical") { Severity::Critical } else { Severity::Warning };
            assert_eq!(d.severity, worst, "{code}");
        }
        assert!("GEMM_SLOWER".parse::<Code>().is_err());
    }

    /// docs/findings.md's table is the list of codes above, row for row.
    #[test]
    fn docs_list_every_code() {
        let docs = include_str!("../../docs/findings.md");
        let table = Code::table();
        assert!(docs.contains(&table), "docs/findings.md's table must read, as generated from `Code`:\n{table}");
    }
}
