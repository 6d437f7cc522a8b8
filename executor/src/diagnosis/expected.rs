//! Each rank against what a healthy device of its model reaches (common/data/expected.toml,
//! with each figure's source), with the table's warn and critical bands.

use gpusanity_common::expected::{Conditions, Expected};
use gpusanity_common::report::Severity;

/// The expected figure for `device`'s `check.metric` under `when`, and where `value` (higher
/// is better) falls: below `critical` x expected critical, below `warn` x expected a warning.
/// None when the table has no figure for this device and configuration (CPUs never do).
pub fn judge(device: &str, check: &str, metric: &str, when: Conditions, value: f64) -> Option<(f64, Option<Severity>)> {
    let table = Expected::builtin();
    let e = table.lookup(device, check, metric, when)?.value;
    let sev = if value < table.bands.critical * e {
        Some(Severity::Critical)
    } else if value < table.bands.warn * e {
        Some(Severity::Warning)
    } else {
        None
    };
    Some((e, sev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_of_the_expected_figure() {
        let when = Conditions { size: Some(8192), ..Default::default() };
        assert_eq!(judge("NVIDIA H200", "gemm", "tflops", when, 770.0), Some((690.0, None)));
        assert_eq!(judge("NVIDIA H200", "gemm", "tflops", when, 600.0), Some((690.0, Some(Severity::Warning))));
        assert_eq!(judge("NVIDIA H200", "gemm", "tflops", when, 400.0), Some((690.0, Some(Severity::Critical))));
        assert_eq!(judge("Intel(R) Xeon(R)", "gemm", "tflops", when, 0.1), None);
    }
}
