//! What another node sends about itself, as node 0 keeps it: not trusted, but bounded and
//! placed. Of a node that cannot run the job's GPUs (not_ready.rs) only readiness codes, at most
//! [`MAX_FINDINGS`] of them; of any node's own finding, strings cut short and figures finite;
//! and each finding put on the node that sent it (a node cannot blame another).

use gpusanity_common::report::{Code, Finding, NodeInfo, Scope, Severity};

/// The most findings one node's registration may bring.
pub const MAX_FINDINGS: usize = 8;
/// The longest message, evidence line or action kept of a node's finding.
const MAX_TEXT: usize = 2048;
/// The most evidence lines kept of one finding.
const MAX_EVIDENCE: usize = 16;
/// The readiness findings that node `info` sent, bounded and placed on it. A node that said it
/// is not ready but sent nothing usable is still not ready: one finding says so.
pub fn accepted(info: &NodeInfo, sent: &[Finding]) -> Vec<Finding> {
    if sent.is_empty() {
        return Vec::new();
    }
    let mut kept: Vec<Finding> = sent
        .iter()
        .filter(|f| {
            matches!(f.code, Code::NodeGpuUnusable | Code::NodeGpusMissing | Code::NodeNoGpu | Code::NodeDriverTooOld)
        })
        .take(MAX_FINDINGS)
        .map(|f| bounded(f, Severity::Critical))
        .collect();
    if kept.is_empty() {
        kept.push(Finding::new(
            Severity::Critical,
            Code::NodeGpuUnusable,
            Scope::Device,
            format!("node {}: said it cannot run the job's GPUs but sent no readiness finding", info.hostname),
        ));
    }
    for f in &mut kept {
        f.node_rank = Some(info.node_rank);
        f.host = Some(info.hostname.clone());
    }
    kept
}

/// A node's own finding as node 0 keeps it: at `severity`, in the device scope, its text and
/// evidence bounded, its figures finite, unplaced (the caller places it on the node that sent it).
pub(crate) fn bounded(f: &Finding, severity: Severity) -> Finding {
    let mut g = Finding::new(severity, f.code, Scope::Device, cut(&f.message));
    g.measured = f.measured.filter(|v| v.is_finite());
    g.expected = f.expected.filter(|v| v.is_finite());
    g.evidence = f.evidence.iter().take(MAX_EVIDENCE).map(|e| cut(e)).collect();
    g.action = f.action.as_deref().map(cut);
    g
}

/// A text another node sent, at most [`MAX_TEXT`] characters of it.
pub(crate) fn cut(s: &str) -> String {
    s.chars().take(MAX_TEXT).collect()
}

/// One line naming every finding: the report's summary and a node's stderr.
pub fn summary(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("{}: {}", f.code, f.message)).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> NodeInfo {
        NodeInfo { node_rank: 3, hostname: "gpu-d".into(), addr: "10.0.0.4".into(), nproc: 0 }
    }

    #[test]
    fn a_node_cannot_blame_another_nor_send_other_codes_nor_grow_without_bound() {
        let mut blame = Finding::new(Severity::Warning, Code::NodeGpuUnusable, Scope::Run, "x".repeat(100_000));
        blame.node_rank = Some(0);
        blame.host = Some("gpu-a".into());
        blame.evidence = vec!["e".repeat(10_000); 1000];
        blame.measured = Some(f64::NAN);
        let other = Finding::new(Severity::Critical, Code::NodeMissing, Scope::Run, "node 0 is missing".into());
        let mut sent = vec![other];
        sent.extend(std::iter::repeat_n(blame, 100));
        let kept = accepted(&info(), &sent);
        assert_eq!(kept.len(), MAX_FINDINGS);
        for f in &kept {
            assert_eq!(f.code, Code::NodeGpuUnusable);
            assert_eq!((f.node_rank, f.host.as_deref()), (Some(3), Some("gpu-d")));
            assert_eq!((f.severity, f.check), (Severity::Critical, Scope::Device));
            assert_eq!(f.message.chars().count(), MAX_TEXT);
            assert_eq!(f.evidence.len(), MAX_EVIDENCE);
            assert!(f.evidence.iter().all(|e| e.len() <= MAX_TEXT));
            assert_eq!(f.measured, None);
        }
    }

    #[test]
    fn a_ready_node_sends_nothing_and_a_node_with_only_foreign_codes_is_still_not_ready() {
        assert!(accepted(&info(), &[]).is_empty());
        let other = Finding::new(Severity::Warning, Code::NodeMissing, Scope::Run, "?".into());
        let kept = accepted(&info(), &[other]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].code, Code::NodeGpuUnusable);
        assert_eq!(kept[0].node_rank, Some(3));
        assert!(kept[0].message.contains("gpu-d"), "{}", kept[0].message);
    }
}
