//! Diagnosis of the node-level hardware checks: the RDMA ports' faults as the check listed
//! them, and a GPU whose host link drops when every GPU of its node copies at once.

use gpusanity_common::findings::Code;
use gpusanity_common::report::{CheckDetail, CheckReport, Finding, RankInfo, Severity};
use gpusanity_common::stats::median;

use super::place;

/// The RDMA ports' faults as local rank 0 of each node listed them, each placed on its node.
pub(super) fn rdma_ports(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    use gpusanity_common::checks::rdma_ports::{ERRORS, FLAPPED, PORT_DOWN, RATE_LOW};
    for r in &c.ranks {
        let Some(CheckDetail::RdmaPorts { issues, .. }) = &r.detail else {
            continue;
        };
        let info = ranks.iter().find(|i| i.rank == r.rank);
        for i in issues {
            let mut f = Finding::new(i.severity, i.code, c.name, i.message.clone());
            f.node_rank = info.map(|i| i.node_rank);
            f.host = info.map(|i| i.host.clone());
            f.evidence = i.deltas.iter().map(|(counter, d)| format!("{}: {counter} grew by {d}", i.port)).collect();
            if let Some(span) = r.notes.get("span") {
                f.evidence.push(format!("counters compared {span}"));
            }
            f.action = Some(
                match i.code {
                    PORT_DOWN => {
                        "check the port's cable, transceiver and switch port, and the subnet manager; exclude the node"
                    }
                    RATE_LOW => "reseat or replace the cable or transceiver; check the switch port's configured speed",
                    FLAPPED => "the link went down or retrained: replace the cable or transceiver; exclude the node",
                    ERRORS => "watch the port: errors on a live link (a marginal cable or transceiver)",
                    _ => "inspect the port",
                }
                .into(),
            );
            findings.push(f);
        }
    }
}

/// Each GPU's host link with every GPU of its node copying at once (the lower direction)
/// against its peers of the same device model: a GPU below `slow_fraction` of their median
/// shares its link or sits on the wrong NUMA node. A warning: the single-GPU figures are the
/// headline (judged against peers and expected), this is where a topology fault shows.
pub(super) fn host_concurrent(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, findings: &mut Vec<Finding>) {
    let device = |rank: usize| ranks.iter().find(|i| i.rank == rank).map(|i| i.device.as_str()).unwrap_or("");
    let figures: Vec<(usize, f64)> =
        c.ranks.iter().filter_map(|r| r.metrics.get("concurrent_gbps").map(|v| (r.rank, *v))).collect();
    for &(rank, v) in &figures {
        let peers: Vec<f64> =
            figures.iter().filter(|(q, _)| *q != rank && device(*q) == device(rank)).map(|(_, v)| *v).collect();
        if peers.is_empty() {
            continue;
        }
        let med = median(&peers);
        if v < slow_fraction * med {
            let msg = format!(
                "{v:.1} GB/s host link with every GPU of the node copying at once, {:.0}% of the peers' median {med:.1}",
                100.0 * v / med
            );
            let mut f = place(Finding::new(Severity::Warning, Code::HostBwConcurrentSlow, c.name, msg), ranks, rank);
            f.measured = Some(v);
            f.peers_median = Some(med);
            f.action = Some(
                "check the GPU's PCIe path (a switch shared with another GPU or NIC, link width and speed) and the NUMA node of the process feeding it".into(),
            );
            findings.push(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use gpusanity_common::report::{CheckStatus, RankResult};

    use super::*;
    use crate::checks::rdma_ports::{judge, Port};

    fn infos(n: usize, per_node: usize) -> Vec<RankInfo> {
        (0..n)
            .map(|i| RankInfo {
                rank: i,
                node_rank: i / per_node,
                local_rank: i % per_node,
                host: format!("h{}", i / per_node),
                device: "NVIDIA H200".into(),
                pid: 0,
                link: None,
            })
            .collect()
    }

    fn report(name: &str, ranks: Vec<RankResult>) -> CheckReport {
        CheckReport {
            name: name.parse().expect("a check's name"),
            status: CheckStatus::NotRun,
            duration_s: 1.0,
            config: serde_json::Value::Null,
            ranks,
        }
    }

    #[test]
    fn rdma_issues_become_findings_on_their_node() {
        let up = Port {
            device: "mlx5_0".into(),
            port: "1".into(),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate: "400 Gb/sec (4X NDR)".into(),
            rate_gbps: Some(400.0),
            link_layer: "InfiniBand".into(),
            counters: [("link_downed".to_string(), 0)].into_iter().collect(),
        };
        let mut flapped = up.clone();
        flapped.counters.insert("link_downed".into(), 1);
        let issues = judge(&[up], &[flapped], None, "since the worker started (3.0 s)");
        let mut r = RankResult::new(2, CheckStatus::Failed);
        r.detail = Some(CheckDetail::RdmaPorts { ports: Vec::new(), issues });
        r.notes.insert("span".into(), "since the worker started (3.0 s)".into());
        let mut f = Vec::new();
        rdma_ports(&report("rdma-ports", vec![RankResult::new(0, CheckStatus::Passed), r]), &infos(4, 2), &mut f);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].code, f[0].node_rank, f[0].rank), (Code::RdmaPortFlapped, Some(1), None));
        assert_eq!(f[0].host.as_deref(), Some("h1"));
        assert!(f[0].evidence[0].contains("link_downed grew by 1"), "{:?}", f[0].evidence);
    }

    #[test]
    fn a_gpu_whose_link_drops_with_the_others_is_warned_about() {
        let ranks: Vec<RankResult> = (0..4)
            .map(|i| {
                let mut r = RankResult::new(i, CheckStatus::Passed);
                r.metrics.insert("concurrent_gbps".into(), if i == 3 { 20.0 } else { 50.0 + i as f64 });
                r
            })
            .collect();
        let mut f = Vec::new();
        host_concurrent(&report("host-bandwidth", ranks.clone()), &infos(4, 4), 0.8, &mut f);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].code, f[0].rank, f[0].severity), (Code::HostBwConcurrentSlow, Some(3), Severity::Warning));
        let even: Vec<RankResult> = ranks[..3].to_vec();
        let mut f = Vec::new();
        host_concurrent(&report("host-bandwidth", even), &infos(4, 4), 0.8, &mut f);
        assert!(f.is_empty(), "{f:?}");
    }
}
