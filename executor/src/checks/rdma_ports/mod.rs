//! `rdma-ports`: every RDMA port of every node (/sys/class/infiniband): its state, physical
//! state, rate and link layer, and its error counters at both ends of a span, read by local
//! rank 0 of each node (a host read: the same on both backends).
//!
//! The span: the worker reads the ports when it starts (before its backend opens, when
//! `rdma-ports` is selected), and the check reads them again at its end, after watching them for
//! `window-ms` itself; `rdma-ports` runs after every other check, so the counters cover the
//! whole run's traffic (collectives over the RDMA network included). Without the worker's
//! reading (none taken), the span is the check's own window.
//!
//! Findings, per port, on its node: not ACTIVE / LinkUp, a rate below the expected rate
//! (`expected-rate-gbps`, else the fastest port of the same link layer on the node), a
//! `link_downed` or `link_error_recovery` that grew (the port flapped), error counters that
//! grew. A node without RDMA devices reports the check `not_applicable`.
//!
//! Tests point the reads at a fake tree with `GPUSANITY_TEST_IB_ROOT`, which the launcher
//! passes to its workers only with `--test-faults`.

pub mod judge;
pub mod sysfs;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use gpusanity_common::report::{CheckDetail, CheckStatus, Code, RankResult, Severity};

use super::CheckCtx;
pub use judge::{judge, Issue};
pub use sysfs::{Port, Snapshot, SYSFS_ROOT};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::RdmaPorts;

/// The test hook: a fake /sys/class/infiniband for the workers (honoured only with
/// `--test-faults`: the launcher removes it from its workers' environment otherwise).
pub use gpusanity_common::envs::IB_ROOT_ENV;

/// Where the workers read the ports: the fake tree of the test hook, or the real one.
pub fn root(test_root: Option<&PathBuf>) -> PathBuf {
    test_root.cloned().unwrap_or_else(|| PathBuf::from(SYSFS_ROOT))
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.rdma_ports.clone();
    let rank = ctx.place.rank;
    let root = root(ctx.faults.ib_root());
    let first = Snapshot::take(&root);
    let baseline = ctx.baseline.rdma.as_ref();
    if first.ports.is_empty() && baseline.is_none_or(|b| b.ports.is_empty()) {
        return Ok(super::not_applicable(rank, format!("no RDMA devices (nothing under {})", root.display())));
    }
    if ctx.place.local_rank != 0 {
        let mut r = RankResult::new(rank, CheckStatus::Passed);
        r.notes.insert("read_by".into(), "the node's ports are read by its local rank 0".into());
        return Ok(r);
    }
    // Watch in steps of at most a second, reporting each: a long window is progress, not a
    // stall, to the launcher.
    let mut left = cfg.window_ms;
    while left > 0 {
        ctx.progress.phase(NAME, "window", cfg.window_ms - left);
        let step = left.min(1000);
        std::thread::sleep(Duration::from_millis(step));
        left -= step;
    }
    let end = Snapshot::take(&root);
    let (start, span) = match baseline {
        Some(b) => (b, format!("since the worker started ({:.1} s)", end.at.duration_since(b.at).as_secs_f64())),
        None => (&first, format!("during the check ({:.1} s)", end.at.duration_since(first.at).as_secs_f64())),
    };
    let issues = judge(&start.ports, &end.ports, cfg.expected_rate_gbps, &span);

    let critical = issues.iter().any(|i| i.severity == Severity::Critical);
    let mut r = RankResult::new(rank, if critical { CheckStatus::Failed } else { CheckStatus::Passed });
    let count = |code: Code| issues.iter().filter(|i| i.code == code).count() as f64;
    use gpusanity_common::checks::rdma_ports as codes;
    r.metrics.insert("ports".into(), end.ports.len() as f64);
    r.metrics.insert("ports_down".into(), count(codes::PORT_DOWN));
    r.metrics.insert("ports_slow".into(), count(codes::RATE_LOW));
    r.metrics.insert("ports_flapped".into(), count(codes::FLAPPED));
    r.metrics.insert("ports_with_errors".into(), count(codes::ERRORS));
    r.metrics.insert("span_s".into(), end.at.duration_since(start.at).as_secs_f64());
    r.notes.insert("span".into(), span);
    if critical {
        let what: Vec<&str> =
            issues.iter().filter(|i| i.severity == Severity::Critical).map(|i| i.message.as_str()).collect();
        r.error = Some(what.join("; "));
    }
    r.detail = Some(CheckDetail::RdmaPorts { ports: end.ports, issues });
    Ok(r)
}
