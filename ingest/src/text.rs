//! Checks of the text that enters the service from outside (job events, agent reports, the
//! API): names and ids are one short line of printable characters; free text (reasons, error
//! lines, report contents) may hold line breaks but never a NUL, which PostgreSQL cannot store
//! in a text column.

use thiserror::Error;

/// The most bytes of a name or id (job, event, workspace, node, run, agent, rule).
pub const MAX_NAME: usize = 256;
/// The most bytes of one free-text field (a reason, an error line, SanityCheckArgs).
pub const MAX_TEXT: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TextError {
    #[error("is empty")]
    Empty,
    #[error("is {len} bytes long (at most {max})")]
    TooLong { len: usize, max: usize },
    #[error("holds a NUL character (byte {at})")]
    Nul { at: usize },
    #[error("holds the control character U+{code:04X} (byte {at})")]
    Control { at: usize, code: u32 },
}

/// A name or id: not blank, at most [`MAX_NAME`] bytes, no NUL and no control characters.
pub fn check_name(value: &str) -> Result<(), TextError> {
    if value.trim().is_empty() {
        return Err(TextError::Empty);
    }
    check_len(value, MAX_NAME)?;
    match value.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, '\0')) => Err(TextError::Nul { at }),
        Some((at, c)) => Err(TextError::Control { at, code: u32::from(c) }),
        None => Ok(()),
    }
}

/// Free text: at most `max` bytes and no NUL (line breaks and tabs are fine).
pub fn check_text(value: &str, max: usize) -> Result<(), TextError> {
    check_len(value, max)?;
    match value.find('\0') {
        Some(at) => Err(TextError::Nul { at }),
        None => Ok(()),
    }
}

fn check_len(value: &str, max: usize) -> Result<(), TextError> {
    if value.len() > max {
        return Err(TextError::TooLong { len: value.len(), max });
    }
    Ok(())
}

/// The path (`nodes[1].name`) of the first string in `v`, key or value, that holds a NUL.
pub fn first_nul(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => s.contains('\0').then(String::new),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, x)| first_nul(x).map(|p| format!("[{i}]{p}")))
        }
        serde_json::Value::Object(m) => m.iter().find_map(|(k, x)| {
            if k.contains('\0') {
                return Some(format!(".{}", k.replace('\0', "\\u0000")));
            }
            first_nul(x).map(|p| format!(".{k}{p}"))
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name("job-1"), Ok(()));
        assert_eq!(check_name("gpu a.example"), Ok(()));
        assert_eq!(check_name(" "), Err(TextError::Empty));
        assert_eq!(check_name("a\0b"), Err(TextError::Nul { at: 1 }));
        assert_eq!(check_name("a\nb"), Err(TextError::Control { at: 1, code: 10 }));
        assert_eq!(check_name("a\u{7f}"), Err(TextError::Control { at: 1, code: 0x7f }));
        assert_eq!(check_name(&"x".repeat(MAX_NAME + 1)), Err(TextError::TooLong { len: MAX_NAME + 1, max: MAX_NAME }));
        assert_eq!(check_name("a\0b").unwrap_err().to_string(), "holds a NUL character (byte 1)");
    }

    #[test]
    fn text_and_json() {
        assert_eq!(check_text("two\nlines\t", 100), Ok(()));
        assert_eq!(check_text("a\0", 100), Err(TextError::Nul { at: 1 }));
        assert!(matches!(check_text("abc", 2), Err(TextError::TooLong { .. })));
        let v = serde_json::json!({"a": 1, "nodes": [{"name": "ok"}, {"name": "b\u{0}"}]});
        assert_eq!(first_nul(&v).as_deref(), Some(".nodes[1].name"));
        assert_eq!(first_nul(&serde_json::json!({"a": ["x", 2]})), None);
    }
}
