//! Which figures of a report a fleet baseline may learn from, and the key of each rank's
//! headline figure (the judging uses the same keys, so a figure is judged against exactly what
//! figures like it were learned into).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::expected::Conditions;
use crate::kinds::DeviceKind;
use crate::peers;
use crate::report::{common_link, CheckReport, CheckStatus, RankInfo, Report, RunStatus};

use super::{driver_major, Key};

/// One figure to learn: the rank, its node's name in the run, the key and the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Learnable {
    pub rank: usize,
    pub node: String,
    pub key: Key,
    pub value: f64,
}

/// Ranks per node, by node rank.
fn node_sizes(ranks: &[RankInfo]) -> Vec<usize> {
    let nodes = ranks.iter().map(|r| r.node_rank + 1).max().unwrap_or(0);
    let mut sizes = vec![0; nodes];
    for r in ranks {
        if let Some(n) = sizes.get_mut(r.node_rank) {
            *n += 1;
        }
    }
    sizes
}

/// Each rank's driver major version, from its gpu-health readings (GPU runs only).
pub fn drivers(checks: &[CheckReport]) -> BTreeMap<usize, u32> {
    checks
        .iter()
        .filter(|c| c.name == crate::registry::CheckId::GpuHealth)
        .flat_map(|c| c.ranks.iter())
        .filter_map(|r| {
            let readings = r.detail.as_ref()?.readings()?;
            Some((r.rank, driver_major(readings.driver_version.as_deref()?)?))
        })
        .collect()
}

/// Each rank's information by its rank: looked up once per rank result, not found by a scan
/// of every rank (a scan per rank was quadratic: seconds at 16,384 ranks).
fn by_rank(ranks: &[RankInfo]) -> HashMap<usize, &RankInfo> {
    ranks.iter().map(|i| (i.rank, i)).collect()
}

/// The key of every rank of `c` with a headline figure, with the figure
/// ([`peers::judged_key`]): on CPU workers (`backend`) the rate per CPU-second
/// where every passed rank with the headline measured it (a CPU worker descheduled by other
/// processes loses wall time, not speed), else the wall-clock headline. The key's metric names
/// which (`tflops_cpu` or `tflops`), so the two are never pooled.
pub fn rank_keys(
    c: &CheckReport,
    ranks: &[RankInfo],
    drivers: &BTreeMap<usize, u32>,
    backend: DeviceKind,
) -> Vec<(usize, Key, f64)> {
    let Some(m) = c.name.metric() else { return Vec::new() };
    let when = Conditions::from_config(&c.config, &node_sizes(ranks)).with_link(common_link(ranks));
    let infos = by_rank(ranks);
    let passed = || c.ranks.iter().filter(|r| r.status == CheckStatus::Passed && r.metrics.contains_key(m.key));
    let per_cpu = peers::cpu_key(m.key);
    let key = peers::judged_key(m.key, backend == DeviceKind::Cpu, passed().map(|r| r.metrics.contains_key(&per_cpu)));
    passed()
        .filter_map(|r| {
            let value = *r.metrics.get(&key)?;
            let info = infos.get(&r.rank)?;
            Some((r.rank, Key::new(&info.device, drivers.get(&r.rank).copied(), c.name, &key, when), value))
        })
        .collect()
}

/// The figures of `report` a baseline may learn: none from a run that did not pass or that
/// ran with fault injection (`GPUSANITY_FAULT` among its variables); none of a rank, or of a
/// rank's node, that any finding names (a rank found slow, even as a warning); none of a check
/// with a finding about the whole job. `node_names[k]` is node k's name in the run. The caller
/// answers for where the report came from (the service: node 0's agent, signed by its key).
pub fn learnable(report: &Report, node_names: &[String]) -> Vec<Learnable> {
    let faulted = report.settings.envs.iter().any(|(k, _)| k == crate::envs::FAULT_ENV);
    if report.status != RunStatus::Passed || faulted {
        return Vec::new();
    }
    let drivers = drivers(&report.checks);
    let infos = by_rank(&report.ranks);
    let named_ranks: HashSet<usize> = report.findings.iter().filter_map(|f| f.rank).collect();
    let named_nodes: HashSet<usize> = report.findings.iter().filter_map(|f| f.node_rank).collect();
    let mut out = Vec::new();
    for c in &report.checks {
        let about = |f: &&crate::findings::Finding| f.check.check() == Some(c.name);
        if report.findings.iter().filter(about).any(|f| f.rank.is_none() && f.node_rank.is_none()) {
            continue;
        }
        for (rank, key, value) in rank_keys(c, &report.ranks, &drivers, report.backend) {
            let Some(info) = infos.get(&rank) else { continue };
            let named = named_ranks.contains(&rank) || named_nodes.contains(&info.node_rank);
            let Some(node) = node_names.get(info.node_rank) else { continue };
            if named || !value.is_finite() || value <= 0.0 {
                continue;
            }
            out.push(Learnable { rank, node: node.clone(), key, value });
        }
    }
    out
}
