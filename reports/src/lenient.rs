//! Reading a stored report that another gpusanity version wrote. Check names, finding codes and
//! detail kinds are typed ([`CheckId`](gpusanity_common::registry::CheckId),
//! [`Code`](gpusanity_common::findings::Code), [`CheckDetail`](gpusanity_common::detail::CheckDetail)),
//! so a report from a version with a check or a code this one does not know would not parse at
//! all. [`read`] parses it strictly first; where that fails, it leaves out the smallest part
//! that does not parse (the list item, or a rank's `detail`), says so, and tries again, so the
//! page shows everything this version knows and lists what it left out.
//!
//! `serde_path_to_error` names the part: serde alone says what failed, not where.

use gpusanity_common::report::Report;
use serde_json::Value;
use serde_path_to_error::Segment;
use thiserror::Error;

/// At most this many parts are left out of one report before it is refused (each try parses
/// the whole report again, so a report made only of unknown parts costs bounded work).
pub const MAX_LEFT_OUT: usize = 256;
/// At most this many characters of a left-out part's name are quoted.
const MAX_QUOTE: usize = 80;

/// A report, with what was left out of it to read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Lenient {
    pub report: Report,
    /// Each part left out, in words (`check "x-new" (checks[3]): unknown variant ...`).
    pub left_out: Vec<String>,
}

#[derive(Debug, Error)]
pub enum LenientError {
    /// Not JSON, or a part this reader cannot leave out (a field of the report itself).
    #[error("{0}")]
    Malformed(serde_json::Error),
    #[error("more than {MAX_LEFT_OUT} parts of the report are unknown to this version")]
    TooManyUnknown,
}

/// Reads report.json text, leaving out the parts this version cannot read (see the module).
pub fn read(text: &str) -> Result<Lenient, LenientError> {
    let mut value: Value = serde_json::from_str(text).map_err(LenientError::Malformed)?;
    let mut left_out = Vec::new();
    loop {
        let e = match serde_path_to_error::deserialize::<_, Report>(&value) {
            Ok(report) => return Ok(Lenient { report, left_out }),
            Err(e) => e,
        };
        if left_out.len() >= MAX_LEFT_OUT {
            return Err(LenientError::TooManyUnknown);
        }
        let segments: Vec<&Segment> = e.path().iter().collect();
        let Some(said) = leave_out(&mut value, &segments) else {
            return Err(LenientError::Malformed(e.into_inner()));
        };
        left_out.push(format!("{said}: {}", quote(&e.inner().to_string())));
    }
}

/// Removes from `value` the part that `path` fails in: the innermost rank `detail` on the path,
/// else the innermost list item. Returns its description, or `None` when the path holds no
/// such part.
fn leave_out(value: &mut Value, path: &[&Segment]) -> Option<String> {
    let is_detail = |s: &&Segment| matches!(s, Segment::Map { key } if key == "detail");
    let cut =
        path.iter().rposition(is_detail).or_else(|| path.iter().rposition(|s| matches!(s, Segment::Seq { .. })))?;
    let mut at = &mut *value;
    let mut name = String::new();
    for s in &path[..cut] {
        at = step(at, s, &mut name)?;
    }
    let mut part = name;
    match path[cut] {
        Segment::Seq { index } => {
            let list = at.as_array_mut()?;
            if *index >= list.len() {
                return None;
            }
            let item = list.remove(*index);
            part.push_str(&format!("[{index}]"));
            Some(describe(&item, &part))
        }
        Segment::Map { key } => {
            at.as_object_mut()?.remove(key)?;
            Some(format!("{part}.{key}"))
        }
        _ => None,
    }
}

/// One step down `value` along `s`, extending the dotted `name`.
fn step<'a>(value: &'a mut Value, s: &Segment, name: &mut String) -> Option<&'a mut Value> {
    match s {
        Segment::Seq { index } => {
            name.push_str(&format!("[{index}]"));
            value.get_mut(*index)
        }
        Segment::Map { key } => {
            if !name.is_empty() {
                name.push('.');
            }
            name.push_str(key);
            value.get_mut(key.as_str())
        }
        // An externally tagged enum nests its content under the variant's name.
        Segment::Enum { variant } => {
            if value.get(variant.as_str()).is_some() {
                value.get_mut(variant.as_str())
            } else {
                Some(value)
            }
        }
        Segment::Unknown => None,
    }
}

/// `check "x-new" (checks[3])` for an item with a `name`, `finding "X_NEW" (findings[0])` for
/// one with a `code`, else the path alone.
fn describe(item: &Value, path: &str) -> String {
    let field = |k: &str| item.get(k).and_then(Value::as_str).map(quote);
    match (field("name"), field("code"), item.as_str()) {
        (Some(n), _, _) => format!("check \"{n}\" ({path})"),
        (None, Some(c), _) => format!("finding \"{c}\" ({path})"),
        (None, None, Some(s)) => format!("\"{}\" ({path})", quote(s)),
        (None, None, None) => path.to_string(),
    }
}

/// `s`, cut to [`MAX_QUOTE`] characters.
fn quote(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTE) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests;
