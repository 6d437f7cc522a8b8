//! Which figures of each check are its headline: the columns of the terminal tables and of
//! the HTML page's per-rank tables, and the ones the page draws per rank.

use gpusanity_common::report::CheckStatus;

/// The headline metrics shown per check, with their column titles.
pub fn columns(check: &str) -> &'static [(&'static str, &'static str)] {
    match check {
        "gemm" => &[("tflops", "TFLOP/s"), ("tflops_best", "best"), ("wrong_elements", "wrong")],
        "pair-bandwidth" => &[("rounds", "rounds"), ("pairs", "pairs"), ("busbw_gbps_min", "slowest GB/s")],
        "kernel-launch" => {
            &[("launch_us", "launch us"), ("round_trip_us", "launch+sync us"), ("round_trip_best_us", "best")]
        }
        "multi-all-reduce" => &[("busbw_gbps_min", "min group busbw"), ("wrong_elements", "wrong")],
        "matmul-all-reduce-overlap" => &[
            ("gemm_ms_alone", "gemm ms"),
            ("allreduce_ms_alone", "allreduce ms"),
            ("overlapped_step_ms", "overlapped ms"),
            ("overlap_efficiency", "efficiency"),
        ],
        "network-connectivity" => &[("front_failed", "front failed"), ("back_failed", "back failed")],
        "all-reduce" | "all-gather" | "all-to-all" => &[
            ("busbw_gbps", "busbw GB/s @max"),
            ("busbw_gbps_peak", "peak busbw"),
            ("small_time_us", "small msg us"),
            ("wrong_elements", "wrong"),
        ],
        "mini-gpt" | "megatron-gpt" => &[
            ("step_ms_median", "step ms"),
            ("tokens_per_s", "tokens/s"),
            ("tflops", "TFLOP/s"),
            ("mfu", "MFU"),
            ("loss_first", "first loss"),
            ("loss_final", "final loss"),
        ],
        "resnet" => &[
            ("step_ms_median", "step ms"),
            ("images_per_s", "images/s"),
            ("tflops", "TFLOP/s"),
            ("mfu", "MFU"),
            ("loss_first", "first loss"),
            ("loss_final", "final loss"),
        ],
        _ => &[],
    }
}

/// The per-rank figures drawn as bar charts, a subset of [`columns`] (counts and losses are
/// left to the tables).
pub fn charted(check: &str) -> &'static [(&'static str, &'static str)] {
    match check {
        "gemm" => &[("tflops", "TFLOP/s")],
        "kernel-launch" => &[("round_trip_us", "launch+sync us")],
        "multi-all-reduce" => &[("busbw_gbps_min", "min group busbw GB/s")],
        "matmul-all-reduce-overlap" => {
            &[("overlapped_step_ms", "overlapped step ms"), ("overlap_efficiency", "overlap efficiency")]
        }
        "all-reduce" | "all-gather" | "all-to-all" => &[("busbw_gbps", "busbw GB/s at the largest message")],
        "mini-gpt" | "megatron-gpt" => &[("step_ms_median", "step ms"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU")],
        "resnet" => &[("step_ms_median", "step ms"), ("images_per_s", "images/s"), ("mfu", "MFU")],
        _ => &[],
    }
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
        for check in gpusanity_common::CHECKS.iter().map(|c| c.name) {
            for (key, _) in charted(check) {
                assert!(columns(check).iter().any(|(k, _)| k == key), "{check}.{key}");
            }
        }
    }
}
