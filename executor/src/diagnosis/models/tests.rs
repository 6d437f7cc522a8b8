use gpusanity_common::report::{CheckReport, CheckStatus, RankInfo, RankResult};

use super::*;

fn info(n: usize) -> Vec<RankInfo> {
    (0..n)
        .map(|rank| RankInfo {
            rank,
            node_rank: 0,
            local_rank: rank,
            host: "h".into(),
            device: "dev".into(),
            pid: 1,
            link: None,
        })
        .collect()
}

fn rank(rank: usize, checksum: &str, compute_ms: f64) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.detail = Some(CheckDetail::Model {
        losses: vec![Some(2.0), Some(1.0)],
        loss_finding: None,
        dp_group: 0,
        param_checksum: checksum.into(),
        changed_at_rest: None,
    });
    r.metrics.insert("compute_ms_median".into(), compute_ms);
    r
}

fn report(ranks: Vec<RankResult>) -> CheckReport {
    CheckReport {
        name: CheckId::MiniGpt,
        status: CheckStatus::Passed,
        duration_s: 1.0,
        config: serde_json::Value::Null,
        ranks,
    }
}

fn codes(c: &CheckReport, n: usize) -> Vec<(Code, Option<usize>, Severity)> {
    let mut out = Vec::new();
    findings(c, &info(n), 0.5, &mut out);
    out.into_iter().map(|f| (f.code, f.rank, f.severity)).collect()
}

const SDC: Code = Code::ModelSilentDataCorruption;

#[test]
fn healthy_ranks_give_no_finding_and_other_checks_are_ignored() {
    let c = report(vec![rank(0, "a", 10.0), rank(1, "a", 11.0)]);
    assert!(codes(&c, 2).is_empty());
    let mut gemm = report(vec![rank(0, "a", 10.0), rank(1, "b", 50.0)]);
    gemm.name = CheckId::Gemm;
    assert!(codes(&gemm, 2).is_empty());
}

#[test]
fn a_checksum_off_the_majority_or_changed_at_rest_names_the_rank() {
    let c = report(vec![rank(0, "a", 10.0), rank(1, "a", 10.0), rank(2, "b", 10.0)]);
    assert_eq!(codes(&c, 3), [(SDC, Some(2), Severity::Critical)]);
    // Two ranks: no majority, but the rank whose memory changed after the update names itself.
    let mut bad = rank(1, "b", 10.0);
    bad.status = CheckStatus::Failed;
    if let Some(CheckDetail::Model { changed_at_rest, .. }) = &mut bad.detail {
        *changed_at_rest = Some("checksum 00000000000000aa after it, 00000000000000b0 at the end".into());
    }
    let c = report(vec![rank(0, "a", 10.0), bad.clone()]);
    assert_eq!(codes(&c, 2), [(SDC, Some(1), Severity::Critical)]);
    // One rank alone: no peers to differ from; the message says what changed, not "peers".
    let mut alone = bad;
    alone.rank = 0;
    let mut found = Vec::new();
    findings(&report(vec![alone]), &info(1), 0.5, &mut found);
    let f = found.iter().find(|f| f.code == SDC).expect("named");
    assert!(f.message.contains("changed in memory after the last optimizer update (checksum"), "{}", f.message);
    assert!(!f.message.contains("peers"), "{}", f.message);
    // Two ranks that differ with no other evidence: the job, not a rank.
    let c = report(vec![rank(0, "a", 10.0), rank(1, "b", 10.0)]);
    assert_eq!(codes(&c, 2), [(SDC, None, Severity::Critical)]);
    // Different data-parallel groups (tensor-parallel shards) are not compared.
    let mut other = rank(1, "b", 10.0);
    if let Some(CheckDetail::Model { dp_group, .. }) = &mut other.detail {
        *dp_group = 1;
    }
    assert!(codes(&report(vec![rank(0, "a", 10.0), other]), 2).is_empty());
}

#[test]
fn the_first_non_finite_loss_is_named_and_later_ones_are_warnings() {
    let nan = |r: usize, step: f64| {
        let mut x = rank(r, "n", 10.0);
        x.status = CheckStatus::Failed;
        x.metrics.insert("first_bad_step".into(), step);
        if let Some(CheckDetail::Model { loss_finding, .. }) = &mut x.detail {
            *loss_finding = Some(Code::ModelLossNotFinite);
        }
        x.error = Some(format!("loss is NaN at step {step}"));
        x
    };
    let c = report(vec![nan(0, 4.0), nan(1, 3.0)]);
    let got = codes(&c, 2);
    assert!(got.contains(&(Code::ModelLossNotFinite, Some(1), Severity::Critical)), "{got:?}");
    assert!(got.contains(&(Code::ModelLossNotFinite, Some(0), Severity::Warning)), "{got:?}");
}

#[test]
fn a_rank_with_slow_compute_is_named() {
    let c = report(vec![rank(0, "a", 10.0), rank(1, "a", 11.0), rank(2, "a", 30.0)]);
    assert_eq!(codes(&c, 3), [(Code::ModelSlowStep, Some(2), Severity::Critical)]);
    // One slow rank of two is named too; ranks within noise of each other are not.
    let c = report(vec![rank(0, "a", 10.0), rank(1, "a", 60.0)]);
    assert_eq!(codes(&c, 2), [(Code::ModelSlowStep, Some(1), Severity::Critical)]);
    assert!(codes(&report(vec![rank(0, "a", 10.0), rank(1, "a", 14.0)]), 2).is_empty());
}
