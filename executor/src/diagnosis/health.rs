//! Diagnosis of `gpu-health`: the readings each rank recorded, judged by the pure decisions of
//! [`gpusanity_common::health`] and placed on the rank; the census per node; a warning where
//! NVML could not be read (health unknown).

use std::collections::{BTreeMap, HashMap};

use gpusanity_common::config::health::GpuHealthConfig;
use gpusanity_common::health::{census, decide, nvml_unavailable, readiness, Policy, Readiness};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckDetail, CheckReport, Finding, RankInfo};

use super::place;

/// Findings of `c`, if it is the health check, under the run's configuration of it.
pub fn findings(c: &CheckReport, ranks: &[RankInfo], cfg: &GpuHealthConfig, findings: &mut Vec<Finding>) {
    if c.name != CheckId::GpuHealth {
        return;
    }
    let policy = Policy::from_config(cfg);
    let ready = Readiness::from_config(cfg);
    // The most GPUs any rank of a node saw there (they all see the same node).
    let mut visible: BTreeMap<usize, u32> = BTreeMap::new();
    let node_of: HashMap<usize, usize> = ranks.iter().map(|i| (i.rank, i.node_rank)).collect();
    let mut pids: HashMap<usize, Vec<u32>> = HashMap::new();
    for i in ranks {
        pids.entry(i.node_rank).or_default().push(i.pid);
    }
    for r in &c.ranks {
        if let Some(CheckDetail::NvmlUnavailable { why }) = &r.detail {
            findings.push(place(nvml_unavailable(why), ranks, r.rank));
            continue;
        }
        let Some(readings) = r.detail.as_ref().and_then(CheckDetail::readings) else {
            continue;
        };
        let node = node_of.get(&r.rank).copied();
        if let Some(node) = node {
            let v = visible.entry(node).or_insert(0);
            *v = (*v).max(readings.visible_gpus);
        }
        // The run's own workers on this node are never another job's processes.
        let own: &[u32] = node.and_then(|n| pids.get(&n)).map_or(&[], Vec::as_slice);
        let judged = decide(readings, &policy)
            .into_iter()
            .chain(readiness::leftovers(readings, own, &ready))
            .chain(readiness::settings(readings, own, &ready));
        findings.extend(judged.map(|f| place(f, ranks, r.rank)));
    }
    for (node, seen) in visible {
        let on_node: Vec<&RankInfo> = ranks.iter().filter(|i| i.node_rank == node).collect();
        let expected = cfg.expected_gpus.unwrap_or(on_node.len());
        if let Some(mut f) = census(seen, expected) {
            f.node_rank = Some(node);
            f.host = on_node.first().map(|i| i.host.clone());
            f.evidence.push(format!(
                "expected {expected} ({})",
                if cfg.expected_gpus.is_some() {
                    "gpu-health.expected-gpus"
                } else {
                    "the workers started on the node"
                }
            ));
            findings.push(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::health::Readings;
    use gpusanity_common::report::{CheckStatus, Code, RankResult, Severity};

    fn info(rank: usize) -> RankInfo {
        RankInfo {
            rank,
            node_rank: 0,
            local_rank: rank,
            host: "n0".into(),
            device: "NVIDIA H200".into(),
            pid: 1,
            link: None,
        }
    }

    fn report(ranks: Vec<RankResult>, cfg: &GpuHealthConfig) -> CheckReport {
        CheckReport {
            name: NAME_OF,
            status: CheckStatus::Passed,
            duration_s: 0.5,
            config: serde_json::to_value(cfg).unwrap(),
            ranks,
        }
    }

    const NAME_OF: CheckId = CheckId::GpuHealth;

    fn with_readings(rank: usize, edit: impl FnOnce(&mut Readings)) -> RankResult {
        let mut readings: Readings =
            serde_json::from_str(include_str!("../../../common/data/health/h200.json")).unwrap();
        readings.index = rank as u32;
        edit(&mut readings);
        let mut r = RankResult::new(rank, CheckStatus::Passed);
        r.detail = Some(CheckDetail::GpuHealth { readings: Box::new(readings) });
        r
    }

    #[test]
    fn readings_are_judged_on_their_rank_and_the_census_on_the_node() {
        let cfg = GpuHealthConfig { expected_gpus: Some(8), ..Default::default() };
        let c = report(
            vec![
                with_readings(0, |r| r.visible_gpus = 7),
                with_readings(1, |r| {
                    r.visible_gpus = 7;
                    r.xids =
                        gpusanity_common::health::Read::Value(vec![gpusanity_common::health::XidEvent { xid: 79 }]);
                }),
            ],
            &cfg,
        );
        let mut found = Vec::new();
        findings(&c, &[info(0), info(1)], &cfg, &mut found);
        let got: Vec<(Code, Option<usize>, Option<usize>)> =
            found.iter().map(|f| (f.code, f.rank, f.node_rank)).collect();
        assert_eq!(got, [(Code::GpuHealthXidFatal, Some(1), Some(0)), (Code::GpuHealthMissingGpu, None, Some(0))]);
        assert_eq!(found[1].message, "7 of 8 GPUs visible");
        // Without the key, the workers of the node are the expected count.
        let c = report(vec![with_readings(0, |r| r.visible_gpus = 1)], &GpuHealthConfig::default());
        let mut found = Vec::new();
        findings(&c, &[info(0)], &GpuHealthConfig::default(), &mut found);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn the_runs_own_workers_are_never_leftovers_and_a_leftover_is_placed_on_its_rank() {
        use gpusanity_common::health::{GpuProcess, Read};
        let proc_ = |pid: u32, mib: u64| GpuProcess {
            pid,
            name: Some("python3".into()),
            used_mib: Some(mib),
            kind: "compute".into(),
            sm_util: None,
        };
        // Rank 0's GPU holds its own worker, the node's other worker (a peer's context) and a
        // previous job's process.
        let c = report(
            vec![with_readings(0, |r| {
                r.visible_gpus = 2;
                r.processes = Read::Value(vec![proc_(100, 2000), proc_(101, 500), proc_(555, 130_000)]);
            })],
            &GpuHealthConfig::default(),
        );
        let ranks = [RankInfo { pid: 100, ..info(0) }, RankInfo { pid: 101, ..info(1) }];
        let mut found = Vec::new();
        findings(&c, &ranks, &GpuHealthConfig::default(), &mut found);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].code.as_str(), found[0].rank), ("GPU_HEALTH_LEFTOVER_MEMORY", Some(0)));
        assert!(found[0].message.contains("130000 MiB held by other processes: pid 555"), "{}", found[0].message);
        assert!(!found[0].message.contains("pid 100") && !found[0].message.contains("pid 101"));
    }

    #[test]
    fn nvml_missing_on_a_gpu_is_a_warning_on_the_rank() {
        let mut r = RankResult::new(0, CheckStatus::Passed);
        r.detail = Some(CheckDetail::NvmlUnavailable { why: "NVML unavailable: libnvidia-ml.so.1: not found".into() });
        let mut found = Vec::new();
        let cfg = GpuHealthConfig::default();
        findings(&report(vec![r], &cfg), &[info(0)], &cfg, &mut found);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].code, found[0].severity, found[0].rank),
            (Code::GpuHealthNvmlUnavailable, Severity::Warning, Some(0))
        );
    }
}
