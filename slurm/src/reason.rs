//! The drain reason: `gpusanity: CODE[,CODE...] evidence`, bounded and made safe for
//! scontrol and for whoever reads `sinfo -R` (the evidence comes from reports and events).

use gpusanity_common::report::Code;

use crate::SlurmError;

/// The prefix that marks a drain as gpusanity's: only a node drained with it is resumed.
pub const DEFAULT_PREFIX: &str = "gpusanity:";

/// The longest reason set (Slurm stores any length; `sinfo -R` and people read short ones).
pub const MAX_REASON: usize = 160;

/// Printable ASCII only: quotes, backslashes, backticks, control characters and anything
/// else become spaces; runs of spaces collapse; the ends are trimmed.
pub fn sanitise(text: &str) -> String {
    let mapped: String =
        text.chars().map(|c| if c.is_ascii_graphic() && !"\"'`\\".contains(c) { c } else { ' ' }).collect();
    mapped.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A prefix is short printable text that sanitising leaves as it is.
pub fn check_prefix(prefix: &str) -> Result<(), SlurmError> {
    if !prefix.is_empty() && prefix.len() <= 32 && sanitise(prefix) == prefix {
        Ok(())
    } else {
        Err(SlurmError::BadPrefix(prefix.into()))
    }
}

/// `PREFIX CODES EVIDENCE`, sanitised and cut to [`MAX_REASON`] bytes (at a character
/// boundary, which sanitised text always is).
pub fn drain_reason(prefix: &str, codes: &[Code], evidence: &str) -> String {
    let codes: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
    let codes = if codes.is_empty() { "UNKNOWN".to_string() } else { codes.join(",") };
    let mut reason = sanitise(&format!("{prefix} {codes} {evidence}"));
    if reason.len() > MAX_REASON {
        reason.truncate(MAX_REASON);
        reason = reason.trim_end().to_string();
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_prefix_codes_and_evidence() {
        let r = drain_reason(DEFAULT_PREFIX, &[Code::GemmWrongResult, Code::WorkerCrashed], "rank 1 on node2");
        assert_eq!(r, "gpusanity: GEMM_WRONG_RESULT,WORKER_CRASHED rank 1 on node2");
        assert_eq!(drain_reason(DEFAULT_PREFIX, &[], ""), "gpusanity: UNKNOWN");
    }

    #[test]
    fn untrusted_text_loses_quotes_newlines_and_length() {
        let evil = "bad \"quoted\" 'text'\nreason=x `id` $(rm) \\ \u{7f}\u{e9}";
        let r = drain_reason(DEFAULT_PREFIX, &[Code::TestHang], evil);
        assert_eq!(r, "gpusanity: TEST_HANG bad quoted text reason=x id $(rm)");
        for c in ['"', '\'', '\n', '`', '\\'] {
            assert!(!r.contains(c), "{r}");
        }
        let long = drain_reason(DEFAULT_PREFIX, &[Code::TestHang], &"word ".repeat(100));
        assert!(long.len() <= MAX_REASON && long.starts_with("gpusanity: TEST_HANG word"), "{long}");
        assert!(!long.ends_with(' '));
    }

    #[test]
    fn prefixes_must_survive_sanitising() {
        assert!(check_prefix("gpusanity:").is_ok());
        assert!(check_prefix("site-hc:").is_ok());
        for bad in ["", "a\"b", "two words\n", &"p".repeat(33)] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }
}
