//! Which figures of each check are its headline: the columns of the terminal tables and of
//! the HTML page's per-rank tables, and the ones the page draws per rank, as each check's
//! descriptor gives them.

use gpusanity_common::checks::Column;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::CheckStatus;

/// The headline metrics shown per check, with their column titles (from its descriptor).
pub fn columns(check: CheckId) -> &'static [Column] {
    check.descriptor().columns
}

/// The per-rank figures drawn as bar charts, a subset of [`columns`] (counts and losses are
/// left to the tables).
pub fn charted(check: CheckId) -> &'static [Column] {
    check.descriptor().charted
}

pub fn status_word(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Passed => "ok",
        CheckStatus::Failed => "FAILED",
        CheckStatus::Error => "ERROR",
        CheckStatus::TimedOut => "TIMEOUT",
        CheckStatus::NotRun => "not run",
        CheckStatus::NotApplicable => "n/a",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_charted_figure_is_a_column() {
        for check in CheckId::ALL {
            for (key, _) in charted(check) {
                assert!(columns(check).iter().any(|(k, _)| k == key), "{check}.{key}");
            }
        }
    }
}
