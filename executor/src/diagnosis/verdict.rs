//! A verdict per node from the findings that place it: faulty (a critical finding names the
//! node or one of its ranks), suspect (a warning, or an end of a slow pair that could not be
//! pinned on either node), else healthy. The faulty nodes are the ones to isolate.

use gpusanity_common::report::{Finding, NodeHealth, NodeInfo, NodeVerdict, Severity};

pub fn node_verdicts(nodes: &[NodeInfo], findings: &[Finding]) -> Vec<NodeVerdict> {
    nodes
        .iter()
        .map(|n| {
            let mut health = NodeHealth::Healthy;
            let mut codes = Vec::new();
            for f in findings {
                let named = f.node_rank == Some(n.node_rank);
                let in_pair = f.node_rank.is_none() && f.pair.is_some_and(|p| p.contains(&n.node_rank));
                let h = match (named, in_pair, f.severity) {
                    (true, _, Severity::Critical) => NodeHealth::Faulty,
                    (true, _, Severity::Warning) | (_, true, _) => NodeHealth::Suspect,
                    _ => continue,
                };
                health = health.max(h);
                if !codes.contains(&f.code) {
                    codes.push(f.code);
                }
            }
            NodeVerdict { node_rank: n.node_rank, host: n.hostname.clone(), health, codes }
        })
        .collect()
}

pub fn faulty_nodes(verdicts: &[NodeVerdict]) -> Vec<usize> {
    verdicts.iter().filter(|v| v.health == NodeHealth::Faulty).map(|v| v.node_rank).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::report::{CheckId, Code, Scope};

    #[test]
    fn verdicts_follow_the_findings_that_place_a_node() {
        let nodes: Vec<NodeInfo> = (0..4)
            .map(|k| NodeInfo { node_rank: k, hostname: format!("n{k}"), addr: String::new(), nproc: 1 })
            .collect();
        let mut crit = Finding::new(Severity::Critical, Code::GemmSlow, CheckId::Gemm, String::new());
        crit.node_rank = Some(1);
        let mut warn = Finding::new(Severity::Warning, Code::GemmSlow, CheckId::Gemm, String::new());
        warn.node_rank = Some(2);
        let mut link = Finding::new(Severity::Critical, Code::LinkSlow, CheckId::PairBandwidth, String::new());
        link.pair = Some([2, 3]);
        let job = Finding::new(Severity::Critical, Code::RunTimeout, Scope::Run, String::new());
        let v = node_verdicts(&nodes, &[crit, warn, link, job]);
        let h: Vec<NodeHealth> = v.iter().map(|v| v.health).collect();
        assert_eq!(h, [NodeHealth::Healthy, NodeHealth::Faulty, NodeHealth::Suspect, NodeHealth::Suspect]);
        assert_eq!(faulty_nodes(&v), [1]);
        assert_eq!(v[2].codes, [Code::GemmSlow, Code::LinkSlow]);
    }
}
