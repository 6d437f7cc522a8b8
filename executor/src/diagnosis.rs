//! First diagnosis: turns the ranks' results into findings that name a rank, its node and the
//! check, and into the verdict.
//!
//! - a rank that errored, crashed or timed out;
//! - for a timed-out test, the culprits apart from the ranks merely waiting for them: a rank
//!   whose heartbeats stopped (stopped or dead), else the ranks that made the least progress;
//! - a wrong result (the check's own verification, and GEMM result hashes that disagree with
//!   the majority of ranks of the same device model);
//! - a rank far below its peers' median in GEMM TFLOP/s or all-reduce busbw.

use std::collections::BTreeMap;

use gpusanity_common::report::{CheckReport, CheckStatus, Finding, RankInfo, RunStatus, Severity};

use crate::checks::median;

/// A worker whose last heartbeat is older than this is not running.
const STALE_HEARTBEAT_S: f64 = 2.0;

/// Which deadline, if any, ended the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overrun {
    None,
    /// A test overran its per-test limit: someone is stuck.
    Test,
    /// The whole run overran its max time: ranks may all have been progressing.
    Run,
}

pub struct Diagnosis {
    pub findings: Vec<Finding>,
    pub status: RunStatus,
    pub summary: String,
}

fn finding(sev: Severity, code: &str, check: &str, rank: Option<&RankInfo>, message: String) -> Finding {
    let mut f = Finding::new(sev, code, check, message);
    if let Some(r) = rank {
        f.node_rank = Some(r.node_rank);
        f.host = Some(r.host.clone());
        f.rank = Some(r.rank);
    }
    f
}

/// Diagnoses `checks` in place (their statuses) and returns the findings and the verdict.
/// `overrun` says which deadline, if any, stopped the run.
pub fn diagnose(checks: &mut [CheckReport], ranks: &[RankInfo], slow_fraction: f64, overrun: Overrun) -> Diagnosis {
    let timed_out = overrun != Overrun::None;
    let info = |rank: usize| ranks.iter().find(|r| r.rank == rank);
    let mut findings = Vec::new();
    for c in checks.iter_mut() {
        let before = findings.len();
        // Errors and crashes. Ranks stopped because of another rank are not at fault, and an
        // error beside a crash in the same check is most likely its consequence (a peer gone).
        let errored: Vec<_> = c.ranks.iter().filter(|r| r.status == CheckStatus::Error && !r.notes.contains_key("stopped")).collect();
        let crashed: Vec<String> = errored.iter().filter(|r| r.notes.contains_key("exit")).map(|r| r.rank.to_string()).collect();
        for r in &errored {
            let why = r.error.clone().unwrap_or_else(|| "failed".into());
            if r.notes.contains_key("exit") {
                findings.push(finding(Severity::Critical, "WORKER_CRASHED", &c.name, info(r.rank), why));
            } else if crashed.is_empty() {
                findings.push(finding(Severity::Critical, "CHECK_ERROR", &c.name, info(r.rank), why));
            } else {
                let why = format!("{why} (after rank {} crashed)", crashed.join(", "));
                findings.push(finding(Severity::Warning, "CHECK_ERROR", &c.name, info(r.rank), why));
            }
        }
        // Hangs: culprits apart from waiters.
        let hung: Vec<_> = c.ranks.iter().filter(|r| r.status == CheckStatus::TimedOut).collect();
        if !hung.is_empty() {
            let age = |r: &&gpusanity_common::report::RankResult| r.metrics.get("heartbeat_age_s").copied().unwrap_or(0.0);
            let seq = |r: &&gpusanity_common::report::RankResult| r.metrics.get("progress_seq").copied().unwrap_or(0.0);
            let stale: Vec<_> = hung.iter().filter(|r| age(r) > STALE_HEARTBEAT_S).collect();
            let culprits: Vec<_> = if !stale.is_empty() {
                stale
            } else if overrun == Overrun::Run {
                // Out of time overall, but every rank was alive: no rank is to blame.
                Vec::new()
            } else {
                let min = hung.iter().map(seq).fold(f64::INFINITY, f64::min);
                let least: Vec<_> = hung.iter().filter(|r| seq(r) == min).collect();
                // Everyone equally far: no rank stands out, all are named.
                least
            };
            let waiting: Vec<String> = hung.iter().filter(|r| !culprits.iter().any(|c| c.rank == r.rank)).map(|r| r.rank.to_string()).collect();
            for r in &culprits {
                let last = r.notes.get("last_progress").cloned().unwrap_or_else(|| "no progress reported".into());
                let state = if age(r) > STALE_HEARTBEAT_S {
                    format!("no heartbeat for {:.1} s (process stopped or dead)", age(r))
                } else {
                    "alive but not progressing".into()
                };
                let mut msg = format!("did not finish the test in time: {state}; last progress: {last}");
                if !waiting.is_empty() {
                    msg.push_str(&format!("; ranks {} were waiting for it", waiting.join(", ")));
                }
                findings.push(finding(Severity::Critical, "TEST_HANG", &c.name, info(r.rank), msg));
            }
        }
        // Wrong results found by the check's own verifier.
        crate::diagnosis_models::findings(c, ranks, slow_fraction, &mut findings);
        let own = |name: &str| crate::diagnosis_micro::own_findings(name) || crate::diagnosis_models::is_model(name);
        for r in c.ranks.iter().filter(|r| r.status == CheckStatus::Failed && !own(&c.name)) {
            let code = if c.name == "gemm" { "GEMM_WRONG_RESULT" } else { crate::diagnosis_micro::wrong_code(&c.name) };
            let why = r.error.clone().unwrap_or_else(|| "verification failed".into());
            findings.push(finding(Severity::Critical, code, &c.name, info(r.rank), why));
        }
        if c.name == "gemm" {
            hash_disagreement(c, ranks, &mut findings);
        }
        crate::diagnosis_micro::diagnose(c, ranks, slow_fraction, &mut findings);
        // Slow ranks against their peers of the same device model.
        let metric = match c.name.as_str() {
            "gemm" => Some(("tflops", "GEMM_SLOW", "TFLOP/s")),
            "all-reduce" => Some(("busbw_gbps", "ALLREDUCE_SLOW", "GB/s busbw")),
            other => crate::diagnosis_micro::slow_metric(other),
        };
        if let Some((key, code, unit)) = metric {
            let mut by_device: BTreeMap<String, Vec<(usize, f64)>> = BTreeMap::new();
            for r in c.ranks.iter().filter(|r| r.status == CheckStatus::Passed) {
                if let (Some(v), Some(i)) = (r.metrics.get(key), info(r.rank)) {
                    by_device.entry(i.device.clone()).or_default().push((r.rank, *v));
                }
            }
            for group in by_device.values().filter(|g| g.len() >= 2) {
                let med = median(&group.iter().map(|(_, v)| *v).collect::<Vec<_>>());
                for (rank, v) in group.iter().filter(|(_, v)| *v < slow_fraction * med) {
                    let mut f = finding(
                        Severity::Critical,
                        code,
                        &c.name,
                        info(*rank),
                        format!("{v:.1} {unit}, below {:.0}% of the peers' median {med:.1}", slow_fraction * 100.0),
                    );
                    f.measured = Some(*v);
                    f.peers_median = Some(med);
                    findings.push(f);
                }
            }
        }
        let critical = findings[before..].iter().any(|f| f.severity == Severity::Critical);
        c.status = if c.ranks.iter().any(|r| r.status == CheckStatus::TimedOut) {
            CheckStatus::TimedOut
        } else if c.ranks.iter().all(|r| r.status == CheckStatus::NotRun) {
            CheckStatus::NotRun
        } else if !critical && !c.ranks.is_empty() && c.ranks.iter().all(|r| r.status == CheckStatus::NotApplicable) {
            CheckStatus::NotApplicable
        } else if critical || c.ranks.iter().any(|r| !matches!(r.status, CheckStatus::Passed | CheckStatus::NotApplicable)) {
            if c.ranks.iter().any(|r| r.status == CheckStatus::Error) { CheckStatus::Error } else { CheckStatus::Failed }
        } else {
            CheckStatus::Passed
        };
    }
    let failed = findings.iter().any(|f| f.severity == Severity::Critical)
        || checks.iter().any(|c| !matches!(c.status, CheckStatus::Passed | CheckStatus::NotApplicable));
    let status = match (failed, timed_out) {
        (_, true) => RunStatus::TimedOut,
        (true, false) => RunStatus::Failed,
        (false, false) => RunStatus::Passed,
    };
    let summary = summarize(status, &findings, checks);
    Diagnosis { findings, status, summary }
}

/// Ranks of one device model must compute bit-identical products from identical inputs. A rank
/// that disagrees with a strict majority is named; without a majority, a warning.
fn hash_disagreement(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    let mut by_device: BTreeMap<&str, Vec<(usize, &str)>> = BTreeMap::new();
    for r in &c.ranks {
        if let (Some(h), Some(i)) = (r.notes.get("result_hash"), ranks.iter().find(|i| i.rank == r.rank)) {
            by_device.entry(i.device.as_str()).or_default().push((r.rank, h.as_str()));
        }
    }
    for group in by_device.values() {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, h) in group {
            *counts.entry(h).or_default() += 1;
        }
        if counts.len() < 2 {
            continue;
        }
        let (major, n) = counts.iter().max_by_key(|(_, n)| **n).map(|(h, n)| (*h, *n)).unwrap_or(("", 0));
        let info = |rank: usize| ranks.iter().find(|i| i.rank == rank);
        if 2 * n > group.len() {
            for (rank, h) in group.iter().filter(|(_, h)| *h != major) {
                let msg = format!("GEMM result differs from the majority of its peers (hash {h}, majority {major})");
                findings.push(finding(Severity::Critical, "GEMM_RESULT_MISMATCH", &c.name, info(*rank), msg));
            }
        } else {
            let list: Vec<String> = group.iter().map(|(r, h)| format!("rank {r}: {h}")).collect();
            let msg = format!("GEMM results differ between ranks with no majority ({})", list.join(", "));
            findings.push(finding(Severity::Warning, "GEMM_RESULT_MISMATCH", &c.name, None, msg));
        }
    }
}

fn summarize(status: RunStatus, findings: &[Finding], checks: &[CheckReport]) -> String {
    let mut bad: Vec<String> = Vec::new();
    for f in findings.iter().filter(|f| f.severity == Severity::Critical) {
        let place = match (f.rank, &f.host) {
            (Some(r), Some(h)) => format!("rank {r} on {h}"),
            _ => "the job".into(),
        };
        let s = format!("{} in {} ({place})", f.code, f.check);
        if !bad.contains(&s) {
            bad.push(s);
        }
    }
    match status {
        RunStatus::Passed => {
            let names: Vec<String> = checks
                .iter()
                .map(|c| if c.status == CheckStatus::NotApplicable { format!("{} (not applicable)", c.name) } else { c.name.clone() })
                .collect();
            format!("all checks passed: {}", names.join(", "))
        }
        RunStatus::Skipped => "checks skipped".into(),
        _ if bad.is_empty() => "a check did not pass".into(),
        _ => bad.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use gpusanity_common::report::{RankResult, RunStatus};

    use super::*;

    fn ranks(devices: &[&str]) -> Vec<RankInfo> {
        devices
            .iter()
            .enumerate()
            .map(|(i, d)| RankInfo { rank: i, node_rank: i / 2, local_rank: i % 2, host: format!("n{}", i / 2), device: d.to_string(), pid: 0 })
            .collect()
    }

    fn check(name: &str, results: Vec<RankResult>) -> CheckReport {
        CheckReport { name: name.into(), status: CheckStatus::NotRun, duration_s: 1.0, config: serde_json::Value::Null, ranks: results }
    }

    fn gemm_rank(rank: usize, tflops: f64, hash: &str) -> RankResult {
        let mut r = RankResult::new(rank, CheckStatus::Passed);
        r.metrics.insert("tflops".into(), tflops);
        r.notes.insert("result_hash".into(), hash.into());
        r
    }

    fn codes(d: &Diagnosis) -> Vec<(String, Option<usize>)> {
        d.findings.iter().map(|f| (f.code.clone(), f.rank)).collect()
    }

    #[test]
    fn a_slow_rank_is_named_against_peers_of_its_own_model() {
        let info = ranks(&["H200", "H200", "H200", "H200", "A100"]);
        let mut c = vec![check(
            "gemm",
            vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 770.0, "a"), gemm_rank(2, 500.0, "a"), gemm_rank(3, 765.0, "a"), gemm_rank(4, 280.0, "b")],
        )];
        let d = diagnose(&mut c, &info, 0.8, Overrun::None);
        assert_eq!(codes(&d), [("GEMM_SLOW".to_string(), Some(2))]);
        assert_eq!(d.findings[0].host.as_deref(), Some("n1"));
        assert_eq!(d.findings[0].peers_median, Some(762.5));
        assert_eq!(c[0].status, CheckStatus::Failed);
        assert_eq!(d.status, RunStatus::Failed);
        assert!(d.summary.contains("GEMM_SLOW in gemm (rank 2 on n1)"), "{}", d.summary);
    }

    #[test]
    fn a_clean_run_passes_with_no_finding() {
        let info = ranks(&["H200", "H200"]);
        let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 770.0, "a")])];
        let d = diagnose(&mut c, &info, 0.8, Overrun::None);
        assert!(d.findings.is_empty());
        assert_eq!((d.status, c[0].status), (RunStatus::Passed, CheckStatus::Passed));
    }

    #[test]
    fn a_product_differing_from_the_majority_is_named_without_a_majority_warned() {
        let info = ranks(&["H200", "H200", "H200"]);
        let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 760.0, "x"), gemm_rank(2, 760.0, "a")])];
        let d = diagnose(&mut c, &info, 0.8, Overrun::None);
        assert_eq!(codes(&d), [("GEMM_RESULT_MISMATCH".to_string(), Some(1))]);

        let info = ranks(&["H200", "H200"]);
        let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 760.0, "x")])];
        let d = diagnose(&mut c, &info, 0.8, Overrun::None);
        assert_eq!(d.findings.len(), 1);
        assert_eq!(d.findings[0].severity, Severity::Warning);
        assert_eq!(d.status, RunStatus::Passed);
    }

    fn hung(rank: usize, age: f64, seq: f64) -> RankResult {
        let mut r = RankResult::new(rank, CheckStatus::TimedOut);
        r.metrics.insert("heartbeat_age_s".into(), age);
        r.metrics.insert("progress_seq".into(), seq);
        r
    }

    #[test]
    fn hang_culprits_apart_from_waiters() {
        let info = ranks(&["cpu", "cpu", "cpu"]);
        // A stopped process outranks progress counts.
        let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 3.0), hung(1, 9.0, 7.0), hung(2, 0.2, 3.0)])];
        let d = diagnose(&mut c, &info, 0.5, Overrun::Test);
        assert_eq!(codes(&d), [("TEST_HANG".to_string(), Some(1))]);
        assert!(d.findings[0].message.contains("ranks 0, 2 were waiting"), "{}", d.findings[0].message);
        assert_eq!((d.status, c[0].status), (RunStatus::TimedOut, CheckStatus::TimedOut));
        // All alive: the rank that made the least progress.
        let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 9.0), hung(1, 0.1, 2.0), hung(2, 0.2, 9.0)])];
        assert_eq!(codes(&diagnose(&mut c, &info, 0.5, Overrun::Test)), [("TEST_HANG".to_string(), Some(1))]);
        // Out of time overall with everyone alive: nobody is blamed.
        let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 9.0), hung(1, 0.1, 2.0), hung(2, 0.2, 9.0)])];
        let d = diagnose(&mut c, &info, 0.5, Overrun::Run);
        assert!(d.findings.is_empty());
        assert_eq!(d.status, RunStatus::TimedOut);
    }

    #[test]
    fn ranks_stopped_because_of_another_are_not_blamed() {
        let info = ranks(&["cpu", "cpu"]);
        let mut crashed = RankResult::new(0, CheckStatus::Error);
        crashed.error = Some("killed by signal SIGKILL".into());
        crashed.notes.insert("exit".into(), "killed by signal SIGKILL".into());
        let mut stopped = RankResult::new(1, CheckStatus::Error);
        stopped.notes.insert("stopped".into(), "stopped after rank 0 failed".into());
        let mut c = vec![check("gemm", vec![crashed, stopped])];
        let d = diagnose(&mut c, &info, 0.5, Overrun::None);
        assert_eq!(codes(&d), [("WORKER_CRASHED".to_string(), Some(0))]);
        assert_eq!(c[0].status, CheckStatus::Error);
    }
}
