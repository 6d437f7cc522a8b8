//! Unit tests of the whole diagnosis, on hand-built results (right and wrong).

use gpusanity_common::rank_end::RankEnd;
use gpusanity_common::report::{CheckDetail, CheckReport, CheckStatus, DeviceKind, RankInfo, Severity};
use gpusanity_common::report::{Code, RankResult, RunStatus};

use super::*;

fn ranks(devices: &[&str]) -> Vec<RankInfo> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| RankInfo {
            rank: i,
            node_rank: i / 2,
            local_rank: i % 2,
            host: format!("n{}", i / 2),
            device: d.to_string(),
            pid: 0,
            link: None,
        })
        .collect()
}

fn check(name: &str, results: Vec<RankResult>) -> CheckReport {
    CheckReport {
        name: name.parse().expect("a check's name"),
        status: CheckStatus::NotRun,
        duration_s: 1.0,
        config: serde_json::Value::Null,
        ranks: results,
    }
}

fn gemm_rank(rank: usize, tflops: f64, hash: &str) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.metrics.insert("tflops".into(), tflops);
    r.detail = Some(CheckDetail::Gemm { result_hash: hash.into() });
    r
}

fn codes(d: &Diagnosis) -> Vec<(Code, Option<usize>)> {
    d.findings.iter().map(|f| (f.code, f.rank)).collect()
}

#[test]
fn a_slow_rank_is_named_against_peers_of_its_own_model() {
    let info = ranks(&["H200", "H200", "H200", "H200", "A100"]);
    let mut c = vec![check(
        "gemm",
        vec![
            gemm_rank(0, 760.0, "a"),
            gemm_rank(1, 770.0, "a"),
            gemm_rank(2, 500.0, "a"),
            gemm_rank(3, 765.0, "a"),
            gemm_rank(4, 280.0, "b"),
        ],
    )];
    let d = diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda);
    assert_eq!(codes(&d), [(Code::GemmSlow, Some(2))]);
    assert_eq!(d.findings[0].host.as_deref(), Some("n1"));
    assert_eq!(d.findings[0].peers_median, Some(765.0));
    assert_eq!(c[0].status, CheckStatus::Failed);
    assert_eq!(d.status, RunStatus::Failed);
    assert!(d.summary.contains("GEMM_SLOW in gemm (rank 2 on n1)"), "{}", d.summary);
    assert!(d.findings[0].score.is_some_and(|s| s < -3.0));
}

#[test]
fn a_clean_run_passes_with_no_finding() {
    let info = ranks(&["H200", "H200"]);
    let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 770.0, "a")])];
    let d = diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda);
    assert!(d.findings.is_empty());
    assert_eq!((d.status, c[0].status), (RunStatus::Passed, CheckStatus::Passed));
}

#[test]
fn a_product_differing_from_the_majority_is_named_without_a_majority_warned() {
    let info = ranks(&["H200", "H200", "H200"]);
    let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 760.0, "x"), gemm_rank(2, 760.0, "a")])];
    let d = diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda);
    assert_eq!(codes(&d), [(Code::GemmResultMismatch, Some(1))]);

    let info = ranks(&["H200", "H200"]);
    let mut c = vec![check("gemm", vec![gemm_rank(0, 760.0, "a"), gemm_rank(1, 760.0, "x")])];
    let d = diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda);
    assert_eq!(d.findings.len(), 1);
    assert_eq!(d.findings[0].severity, Severity::Warning);
    assert_eq!(d.status, RunStatus::Passed);
}

fn hung(rank: usize, age: f64, seq: u64) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::TimedOut);
    r.end = Some(Box::new(RankEnd { heartbeat_age_s: Some(age), progress_seq: Some(seq), ..RankEnd::default() }));
    r
}

/// A rank's end as the launcher writes it.
fn ended(edit: impl FnOnce(&mut RankEnd)) -> Option<Box<RankEnd>> {
    let mut e = RankEnd::default();
    edit(&mut e);
    Some(Box::new(e))
}

#[test]
fn hang_culprits_apart_from_waiters() {
    let info = ranks(&["cpu", "cpu", "cpu"]);
    // A stopped process outranks progress counts.
    let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 3), hung(1, 9.0, 7), hung(2, 0.2, 3)])];
    let d = diagnose(&mut c, &info, 0.5, Overrun::Test, DeviceKind::Cpu);
    assert_eq!(codes(&d), [(Code::TestHang, Some(1))]);
    assert!(d.findings[0].message.contains("ranks 0, 2 were waiting"), "{}", d.findings[0].message);
    assert_eq!((d.status, c[0].status), (RunStatus::TimedOut, CheckStatus::TimedOut));
    // All alive: the rank that made the least progress.
    let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 9), hung(1, 0.1, 2), hung(2, 0.2, 9)])];
    assert_eq!(codes(&diagnose(&mut c, &info, 0.5, Overrun::Test, DeviceKind::Cpu)), [(Code::TestHang, Some(1))]);
    // Out of time overall with everyone alive: nobody is blamed.
    let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 9), hung(1, 0.1, 2), hung(2, 0.2, 9)])];
    let d = diagnose(&mut c, &info, 0.5, Overrun::Run, DeviceKind::Cpu);
    assert!(d.findings.is_empty());
    assert_eq!(d.status, RunStatus::TimedOut);
}

#[test]
fn ranks_stopped_because_of_another_are_not_blamed() {
    let info = ranks(&["cpu", "cpu"]);
    let mut crashed = RankResult::new(0, CheckStatus::Error);
    crashed.error = Some("killed by signal SIGKILL".into());
    crashed.end = ended(|e| e.exit = Some("killed by signal SIGKILL".into()));
    let mut stopped = RankResult::new(1, CheckStatus::Error);
    stopped.end = ended(|e| e.stopped = Some("stopped after rank 0 failed".into()));
    let mut c = vec![check("gemm", vec![crashed, stopped])];
    let d = diagnose(&mut c, &info, 0.5, Overrun::None, DeviceKind::Cuda);
    assert_eq!(codes(&d), [(Code::WorkerCrashed, Some(0))]);
    assert_eq!(c[0].status, CheckStatus::Error);
}

fn ar_rank(rank: usize, busbw: f64) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.metrics.insert("busbw_gbps".into(), busbw);
    r
}

#[test]
fn a_collective_below_expected_is_one_job_finding_and_only_on_one_node() {
    let info: Vec<RankInfo> = ranks(&["NVIDIA H200", "NVIDIA H200"])
        .into_iter()
        .map(|mut r| {
            r.node_rank = 0;
            r.link = Some(gpusanity_common::report::Link::Nvlink);
            r
        })
        .collect();
    // Over PCIe (or a link not read) the NVLink figure does not hold: peers only.
    let pcie: Vec<RankInfo> =
        info.iter().cloned().map(|r| RankInfo { link: Some(gpusanity_common::report::Link::Pcie), ..r }).collect();
    let mut c = vec![check("all-reduce", vec![ar_rank(0, 150.0), ar_rank(1, 150.0)])];
    c[0].config = serde_json::json!({ "max_bytes": 1u64 << 30 });
    assert!(diagnose(&mut c, &pcie, 0.8, Overrun::None, DeviceKind::Cuda).findings.is_empty());
    let mut c = vec![check("all-reduce", vec![ar_rank(0, 150.0), ar_rank(1, 150.0)])];
    c[0].config = serde_json::json!({ "max_bytes": 1u64 << 30 });
    let d = diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda);
    assert_eq!(codes(&d), [(Code::AllreduceBelowExpected, None)]);
    assert_eq!(d.findings[0].expected, Some(330.0));
    assert_eq!(d.status, RunStatus::Failed);
    // Healthy figures pass.
    let mut c = vec![check("all-reduce", vec![ar_rank(0, 331.0), ar_rank(1, 331.0)])];
    c[0].config = serde_json::json!({ "max_bytes": 1u64 << 30 });
    assert!(diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda).findings.is_empty());
    // Across nodes the NVLink figure does not hold: no finding.
    let info = ranks(&["NVIDIA H200", "NVIDIA H200", "NVIDIA H200"]);
    let mut c = vec![check("all-reduce", vec![ar_rank(0, 40.0), ar_rank(1, 40.0), ar_rank(2, 40.0)])];
    c[0].config = serde_json::json!({ "max_bytes": 1u64 << 30 });
    assert!(diagnose(&mut c, &info, 0.8, Overrun::None, DeviceKind::Cuda).findings.is_empty());
}

#[test]
fn a_re_measured_slow_rank_carries_both_figures_and_a_blip_is_only_reported() {
    let info = ranks(&["cpu", "cpu", "cpu"]);
    let remeasured = |second: f64| {
        let mut r = gemm_rank(2, second, "a");
        r.metrics.insert("first_tflops".into(), 2.1);
        r.notes.insert("remeasured".into(), "rank 2 slow in the first measurement".into());
        vec![check("gemm", vec![gemm_rank(0, 10.0, "a"), gemm_rank(1, 10.2, "a"), r])]
    };
    let mut c = remeasured(2.0);
    let d = diagnose(&mut c, &info, 0.5, Overrun::None, DeviceKind::Cpu);
    assert_eq!(codes(&d), [(Code::GemmSlow, Some(2))]);
    assert!(d.findings[0].evidence[0].contains("slow in both measurements"), "{:?}", d.findings[0].evidence);
    assert_eq!(d.remeasured, ["gemm: rank 2 slow in the first measurement"]);
    // The second measurement was fine: reported, no finding, a pass.
    let mut c = remeasured(10.1);
    let d = diagnose(&mut c, &info, 0.5, Overrun::None, DeviceKind::Cpu);
    assert!(d.findings.is_empty());
    assert_eq!(d.status, RunStatus::Passed);
    assert_eq!(d.remeasured.len(), 1);
}

#[test]
fn the_fleet_judges_the_figure_that_counts_and_a_rank_below_twice_carries_both() {
    use gpusanity_common::fleet::file::BaselineFile;
    // Two CPU ranks on one node; a fleet of centre 10 per CPU-second, spread 0.5: floor 8.
    let info = ranks(&["cpu", "cpu"]);
    let entry = crate::checks::remeasure::tests::entry("cpu", CheckId::Gemm, "tflops_cpu", 2, None);
    let baseline = BaselineFile { judging: None, entries: vec![entry] };
    let rank = |r: usize, per_cpu: f64, first: Option<f64>| {
        let mut x = gemm_rank(r, per_cpu, "a");
        x.metrics.insert("tflops_cpu".into(), per_cpu);
        if let Some(first) = first {
            x.metrics.insert("first_tflops".into(), first);
            x.metrics.insert("first_tflops_cpu".into(), first);
            x.notes.insert("remeasured".into(), "rank 1 below the fleet floor".into());
        }
        x
    };
    // Below only in the first measurement: judged on the second, no finding.
    let mut c = vec![check("gemm", vec![rank(0, 10.0, None), rank(1, 9.9, Some(6.0))])];
    let d = diagnose_with_baseline(&mut c, &info, &cpu_configs(), Overrun::None, DeviceKind::Cpu, Some(&baseline));
    assert!(d.findings.is_empty(), "{:?}", codes(&d));
    assert_eq!(d.status, RunStatus::Passed);
    assert_eq!(c[0].ranks[1].fleet.as_ref().map(|f| (f.value, f.below)), Some((9.9, false)));
    assert_eq!(d.remeasured, ["gemm: rank 1 below the fleet floor"]);
    // Below twice: named, with both figures.
    let mut c = vec![check("gemm", vec![rank(0, 10.0, None), rank(1, 7.0, Some(6.0))])];
    let d = diagnose_with_baseline(&mut c, &info, &cpu_configs(), Overrun::None, DeviceKind::Cpu, Some(&baseline));
    assert_eq!(codes(&d), [(Code::BelowFleet, Some(1))]);
    let evidence = &d.findings[0].evidence;
    assert!(
        evidence.iter().any(|e| e == "below the fleet floor in both measurements: first 6.00, re-measured 7.00"),
        "{evidence:?}"
    );
    // Below in all five measurements; below in the last four, the re-measure called for by
    // another rank (its first above the floor).
    let measured = |first: f64, n: f64| {
        let mut x = rank(1, 7.0, Some(first));
        x.metrics.insert("measurements".into(), n);
        x
    };
    for (first, want) in [
        (6.0, "below the fleet floor in all 5 measurements: first 6.00, last 7.00"),
        (9.0, "below the fleet floor in the last 4 of 5 measurements: first 9.00 (above it), last 7.00"),
    ] {
        let mut c = vec![check("gemm", vec![rank(0, 10.0, None), measured(first, 5.0)])];
        let d = diagnose_with_baseline(&mut c, &info, &cpu_configs(), Overrun::None, DeviceKind::Cpu, Some(&baseline));
        assert_eq!(codes(&d), [(Code::BelowFleet, Some(1))]);
        assert!(d.findings[0].evidence.iter().any(|e| e == want), "{:?}", d.findings[0].evidence);
    }
    // Cleared its floor in its third measurement: judged on it, no finding.
    let mut cleared = measured(6.0, 3.0);
    cleared.metrics.insert("tflops_cpu".into(), 9.8);
    let mut c = vec![check("gemm", vec![rank(0, 10.0, None), cleared])];
    let d = diagnose_with_baseline(&mut c, &info, &cpu_configs(), Overrun::None, DeviceKind::Cpu, Some(&baseline));
    assert!(d.findings.is_empty(), "{:?}", codes(&d));
}

#[test]
fn cpu_ranks_are_judged_on_the_wall_clock_so_a_capped_node_is_named() {
    // Five CPU ranks: rank 1 got a fifth of a core (a CPU quota: a fifth of the wall-clock
    // figure, its peers' rate per CPU-second); rank 3 does eight times the work for its
    // product (slow per CPU-second too). Both are named, as on a GPU
    // (`peers::judged_key` is the fleet's); the rates per CPU-second stay as evidence.
    let info = ranks(&["cpu"; 5]);
    let rank = |r: usize, wall: f64, per_cpu: f64| {
        let mut x = gemm_rank(r, wall, "a");
        x.metrics.insert("tflops_cpu".into(), per_cpu);
        x.metrics.insert("cpu_share".into(), wall / per_cpu);
        x
    };
    let figures = || {
        vec![rank(0, 0.10, 0.10), rank(1, 0.02, 0.101), rank(2, 0.099, 0.1), rank(3, 0.012, 0.0125), rank(4, 0.1, 0.1)]
    };
    for backend in [DeviceKind::Cpu, DeviceKind::Cuda] {
        let d = diagnose(&mut [check("gemm", figures())], &info, 0.5, Overrun::None, backend);
        assert_eq!(codes(&d), [(Code::GemmSlow, Some(1)), (Code::GemmSlow, Some(3))], "{backend:?}");
        assert_eq!(d.findings[0].measured, Some(0.02));
    }
}

#[test]
fn a_lost_node_makes_the_live_ranks_waiters_not_culprits() {
    let info = ranks(&["cpu", "cpu", "cpu"]);
    let mut lost = RankResult::new(2, CheckStatus::Error);
    lost.end = ended(|e| e.node_lost = true);
    let mut c = vec![check("all-reduce", vec![hung(0, 0.1, 3), hung(1, 0.1, 3), lost])];
    let d = diagnose(&mut c, &info, 0.5, Overrun::Test, DeviceKind::Cpu);
    assert!(d.findings.is_empty(), "{:?}", codes(&d));
    assert_eq!(d.status, RunStatus::TimedOut);
}

#[test]
fn the_link_test_names_a_slow_node_from_the_pair_matrix() {
    let info = ranks(&["cpu"; 6])
        .into_iter()
        .map(|mut r| {
            r.node_rank = r.rank;
            r.host = format!("n{}", r.rank);
            r
        })
        .collect::<Vec<_>>();
    let info = &info[..3];
    let m = serde_json::json!([
        { "nodes": [0, 1], "busbw_gbps": 2.0, "round": 1 },
        { "nodes": [0, 2], "busbw_gbps": 0.01, "round": 2 },
        { "nodes": [1, 2], "busbw_gbps": 0.01, "round": 3 },
        { "nodes": [0, 2], "busbw_gbps": 0.02, "round": 4 },
        { "nodes": [1, 2], "busbw_gbps": 0.01, "round": 5 },
    ]);
    let results = (0..3)
        .map(|k| {
            let mut r = RankResult::new(k, CheckStatus::Passed);
            r.detail = Some(CheckDetail::PairBandwidth { pairs: serde_json::from_value(m.clone()).expect("pairs") });
            r
        })
        .collect();
    let mut c = vec![check("pair-bandwidth", results)];
    let d = diagnose(&mut c, info, 0.5, Overrun::None, DeviceKind::Cpu);
    assert_eq!(d.findings.len(), 1);
    assert_eq!(
        (d.findings[0].code, d.findings[0].node_rank, d.findings[0].host.as_deref()),
        (Code::NodeCommSlow, Some(2), Some("n2"))
    );
    assert_eq!(d.pair_bandwidth.len(), 5);
    assert_eq!(d.status, RunStatus::Failed);
}

#[test]
fn the_rank_that_died_first_is_the_culprit() {
    let info = ranks(&["cpu", "cpu", "cpu"]);
    let dead = |rank: usize, at: u64| {
        let mut r = RankResult::new(rank, CheckStatus::Error);
        r.error = Some("killed by signal SIGKILL; last output:\nCUDA error: an illegal memory access".into());
        r.end = ended(|e| {
            e.exit = Some("killed by signal SIGKILL".into());
            e.exit_unix_ms = Some(at);
        });
        r
    };
    let mut c = vec![check("gemm", vec![dead(0, 1_000_450), dead(1, 1_000_000), hung(2, 0.1, 1)])];
    c[0].ranks[2].status = CheckStatus::NotRun;
    let d = diagnose(&mut c, &info, 0.5, Overrun::None, DeviceKind::Cpu);
    let crit: Vec<_> = d.findings.iter().filter(|f| f.severity == Severity::Critical).map(|f| f.rank).collect();
    assert_eq!(crit, [Some(1)]);
    let later = d.findings.iter().find(|f| f.rank == Some(0)).expect("the later death is reported");
    assert!(later.message.contains("450 ms after rank 1 died first"), "{}", later.message);
    assert_eq!(
        d.findings.iter().find(|f| f.rank == Some(1)).unwrap().evidence,
        ["CUDA error: an illegal memory access"]
    );
}

#[test]
fn a_rank_stuck_in_one_check_is_the_culprit_for_peers_waiting_in_the_next() {
    let info = ranks(&["cpu", "cpu", "cpu"]);
    let mut not_run = RankResult::new(2, CheckStatus::NotRun);
    not_run.notes.insert("reason".into(), "the run stopped before this check".into());
    let mut c = vec![
        check("gemm", vec![gemm_rank(0, 10.0, "a"), gemm_rank(1, 10.0, "a"), hung(2, 0.3, 4)]),
        check("all-reduce", vec![hung(0, 0.1, 30), hung(1, 0.1, 30), not_run]),
    ];
    let d = diagnose(&mut c, &info, 0.5, Overrun::Test, DeviceKind::Cpu);
    assert_eq!(codes(&d), [(Code::TestHang, Some(2))]);
    assert_eq!(d.findings[0].check, CheckId::Gemm);
    assert!(d.findings[0].message.contains("ranks 0, 1 were waiting"), "{}", d.findings[0].message);
    assert!(d.findings[0].evidence.iter().any(|e| e.contains("waiting in all-reduce")), "{:?}", d.findings[0].evidence);
}

/// The CPU backend's default configurations, with slow fraction 0.5.
fn cpu_configs() -> gpusanity_common::config::CheckConfigs {
    gpusanity_common::config::CheckConfigs {
        slow_fraction: 0.5,
        ..gpusanity_common::config::CheckConfigs::defaults(DeviceKind::Cpu)
    }
}
