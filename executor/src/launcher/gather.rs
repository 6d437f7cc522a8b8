//! Node 0 merges the nodes' outcomes into one report and diagnoses it.

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::findings::Code;
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::rank_end::RankEnd;
use gpusanity_common::registry::{CheckId, Scope};
use gpusanity_common::report::{
    CheckReport, CheckStatus, DeviceKind, Finding, NodeInfo, RankInfo, RankResult, Report, RunStatus, Severity,
    REPORT_SCHEMA_VERSION,
};
use gpusanity_common::Settings;

use super::outcome::{Heard, NodeOutcome, Stop};
use crate::diagnosis;

pub struct RunMeta {
    pub run_id: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub settings: Settings,
    pub backend: DeviceKind,
    pub configs: CheckConfigs,
    pub checks: Vec<CheckId>,
}

impl RunMeta {
    /// The run's report on `nodes`, finished now, with its status, summary, checks and findings
    /// and each node's verdict drawn from the findings; what only a run whose checks ran has
    /// (the ranks, re-measures, pair bandwidths, host readings) starts empty, for the caller to
    /// set. Every report of a run is made here, so that a new field is set in one place.
    fn report(
        &self,
        nodes: &[NodeInfo],
        status: RunStatus,
        summary: String,
        checks: Vec<CheckReport>,
        findings: Vec<Finding>,
    ) -> Report {
        let node_verdicts = diagnosis::verdict::node_verdicts(nodes, &findings);
        let faulty_nodes = diagnosis::verdict::faulty_nodes(&node_verdicts);
        Report {
            node_verdicts,
            faulty_nodes,
            remeasured: Vec::new(),
            pair_bandwidth: Vec::new(),
            sweep_summaries: Vec::new(),
            hosts: Vec::new(),
            schema_version: REPORT_SCHEMA_VERSION,
            gpusanity_version: env!("CARGO_PKG_VERSION").into(),
            run_id: self.run_id.clone(),
            started_at: self.started_at,
            finished_at: chrono::Utc::now(),
            status,
            summary,
            settings: self.settings.clone(),
            backend: self.backend,
            nodes: nodes.to_vec(),
            ranks: Vec::new(),
            checks,
            findings,
            events: Vec::new(),
        }
    }
}

/// `outcomes[k]` is what node 0 heard from node k (nothing, past the end).
/// `baseline`: the fleet baseline every headline figure is also judged against.
pub fn build_report(meta: &RunMeta, nodes: &[NodeInfo], outcomes: &[Heard], baseline: Option<&BaselineFile>) -> Report {
    let Merged { ranks, mut checks, lost, overrun, stops } = merge(meta, nodes, outcomes);
    let mut diag =
        diagnosis::diagnose_with_baseline(&mut checks, &ranks, &meta.configs, overrun, meta.backend, baseline);
    note_stall(&mut diag.findings, &stops);
    name_what_ended_the_run(&mut diag, &stops);
    name_lost_nodes(&mut diag, &lost);
    let (host_findings, hosts) = super::host::fold(nodes, outcomes);
    diag.findings.extend(host_findings.iter().cloned());
    let mut report = meta.report(nodes, diag.status, diag.summary, checks, diag.findings);
    report.ranks = ranks;
    report.remeasured = diag.remeasured;
    report.pair_bandwidth = diag.pair_bandwidth;
    report.hosts = hosts;
    super::host::apply(&mut report, &host_findings);
    super::compact::compact(&mut report);
    report
}

/// Every node's part of the run, merged: its ranks and each check's results (a lost node's
/// ranks in error), which deadline ended the run, the stops, and the nodes node 0 has no results
/// of (with why, where what they posted was malformed).
struct Merged<'a> {
    ranks: Vec<RankInfo>,
    checks: Vec<CheckReport>,
    lost: Vec<(&'a NodeInfo, Option<&'a str>)>,
    overrun: diagnosis::Overrun,
    stops: Vec<Stop>,
}

fn merge<'a>(meta: &RunMeta, nodes: &'a [NodeInfo], outcomes: &'a [Heard]) -> Merged<'a> {
    let mut m = Merged {
        ranks: Vec::new(),
        checks: not_run_checks(meta),
        lost: Vec::new(),
        overrun: diagnosis::Overrun::None,
        stops: Vec::new(),
    };
    let mut offset = 0;
    for (k, node) in nodes.iter().enumerate() {
        match outcomes.get(k).unwrap_or(&Heard::Silent) {
            Heard::Outcome(o) => m.add(o),
            Heard::Silent => m.add_lost(k, node, offset, None),
            Heard::Malformed(e) => m.add_lost(k, node, offset, Some(e)),
        }
        offset += node.nproc;
    }
    m.ranks.sort_by_key(|r| r.rank);
    for c in m.checks.iter_mut() {
        c.ranks.sort_by_key(|r| r.rank);
    }
    m
}

impl<'a> Merged<'a> {
    /// A node's outcome: its ranks, its results, and what stopped it.
    fn add(&mut self, o: &NodeOutcome) {
        self.ranks.extend(o.ranks.iter().cloned());
        match &o.stop {
            Some(Stop::TestTimeout { .. } | Stop::Stalled { .. }) => self.overrun = diagnosis::Overrun::Test,
            Some(Stop::RunTimeout { .. }) if self.overrun == diagnosis::Overrun::None => {
                self.overrun = diagnosis::Overrun::Run
            }
            _ => {}
        }
        if let Some(s) = &o.stop {
            self.stops.push(s.clone());
        }
        for (c, (dur, results)) in self.checks.iter_mut().zip(&o.checks) {
            c.duration_s = c.duration_s.max(*dur);
            c.ranks.extend(results.iter().cloned());
        }
    }

    /// Node `k`, of which node 0 has no results, its ranks from `offset` on: each in error in
    /// every check.
    fn add_lost(&mut self, k: usize, node: &'a NodeInfo, offset: usize, malformed: Option<&'a str>) {
        self.lost.push((node, malformed));
        for local in 0..node.nproc {
            let rank = offset + local;
            self.ranks.push(RankInfo {
                rank,
                node_rank: k,
                local_rank: local,
                host: node.hostname.clone(),
                device: String::new(),
                pid: 0,
                link: None,
            });
            for c in self.checks.iter_mut() {
                let mut r = RankResult::new(rank, CheckStatus::Error);
                r.end = Some(Box::new(RankEnd { node_lost: true, ..RankEnd::default() }));
                c.ranks.push(r);
            }
        }
    }
}

/// A stall stopped the test before its limit: say so beside the hang it names.
fn note_stall(findings: &mut [Finding], stops: &[Stop]) {
    let Some(Stop::Stalled { node_rank, check, stall_s, silent_rank }) =
        stops.iter().find(|s| matches!(s, Stop::Stalled { .. }))
    else {
        return;
    };
    let why = match silent_rank {
        Some(r) => format!("rank {r} sent no heartbeat"),
        None => "no rank progressed".to_string(),
    };
    let line = format!(
        "{check} stopped by node {node_rank} after {stall_s:.0} s in which {why} (diagnosis.stall-s), before the per-test limit"
    );
    for f in findings.iter_mut().filter(|f| f.code == Code::TestHang) {
        f.evidence.push(line.clone());
    }
}

/// What ended the run, when no rank is to blame for it: the first stop, where it was the whole
/// run's deadline or a signal.
fn name_what_ended_the_run(diag: &mut diagnosis::Diagnosis, stops: &[Stop]) {
    let (code, message) = match stops.first() {
        Some(Stop::RunTimeout { limit_s, .. }) => {
            (Code::RunTimeout, format!("the whole check overran --sanity-check-max-time ({limit_s:.0} s)"))
        }
        Some(Stop::Interrupted { node_rank, signal }) => {
            (Code::RunInterrupted, format!("the launcher of node {node_rank} was stopped by {signal}"))
        }
        _ => return,
    };
    diag.findings.push(Finding::new(Severity::Critical, code, Scope::Run, message.clone()));
    if diag.summary == "a check did not pass" || diag.summary.is_empty() {
        diag.summary = format!("{code}: {message}");
    }
}

/// The nodes node 0 has no results of fail the run, each named first, and the summary says so.
fn name_lost_nodes(diag: &mut diagnosis::Diagnosis, lost: &[(&NodeInfo, Option<&str>)]) {
    if lost.is_empty() {
        return;
    }
    for (node, malformed) in lost {
        diag.findings.insert(0, lost_finding(node, *malformed));
    }
    if diag.status == RunStatus::Passed {
        diag.status = RunStatus::Failed;
    }
    let names: Vec<String> = lost.iter().map(|(n, _)| n.hostname.clone()).collect();
    diag.summary = format!("NODE_LOST ({}); {}", names.join(", "), diag.summary);
}

/// The finding of a node whose results node 0 does not have: it never reported them, or what it
/// posted is not an outcome (`malformed`: why; the finding then says so, not that it was silent).
fn lost_finding(node: &NodeInfo, malformed: Option<&str>) -> Finding {
    let at = format!("node {} ({}, {})", node.node_rank, node.hostname, node.addr);
    let (message, action) = match malformed {
        Some(e) => (
            format!("{at} reported results node 0 cannot read: malformed outcome: {e}"),
            "exclude the node; check that it runs the same gpusanity as node 0",
        ),
        None => (
            format!("{at} never reported its results: unreachable (network down) or dead"),
            "exclude the node; check its network link and whether it is up",
        ),
    };
    let mut f = Finding::new(Severity::Critical, Code::NodeLost, Scope::Rendezvous, message);
    f.node_rank = Some(node.node_rank);
    f.host = Some(node.hostname.clone());
    f.action = Some(action.into());
    f
}

/// Every selected check, not run yet, with the configuration it runs with.
fn not_run_checks(meta: &RunMeta) -> Vec<CheckReport> {
    meta.checks
        .iter()
        .map(|name| CheckReport {
            name: *name,
            status: CheckStatus::NotRun,
            duration_s: 0.0,
            config: name.config_value(&meta.configs),
            ranks: Vec::new(),
        })
        .collect()
}

/// The report of a run some of whose nodes never arrived at the rendezvous: no check ran, each
/// missing node is named (rank and what is known of it), and the run fails. `not_ready` holds
/// the findings of the nodes that arrived but cannot run the job's GPUs.
pub fn missing_report(
    meta: &RunMeta,
    nodes: &[NodeInfo],
    missing: &[usize],
    waited: std::time::Duration,
    not_ready: Vec<Finding>,
) -> Report {
    let mut findings = Vec::new();
    for &k in missing {
        let mut f = Finding::new(
            Severity::Critical,
            Code::NodeMissing,
            Scope::Rendezvous,
            format!(
                "node {k}{} of {} never arrived at the rendezvous within {:.0} s: not started, unreachable, or dead",
                nodes
                    .get(k)
                    .filter(|n| n.hostname != format!("node {k}"))
                    .map_or(String::new(), |n| format!(" ({})", n.hostname)),
                nodes.len(),
                waited.as_secs_f64()
            ),
        );
        f.node_rank = Some(k);
        f.host = nodes.get(k).map(|n| n.hostname.clone());
        f.evidence.push(format!("nodes that arrived: {}", arrived(nodes, missing)));
        f.action =
            Some("exclude the node or start its launcher; check that it reaches node 0's address and port".into());
        findings.push(f);
    }
    let list: Vec<String> = missing.iter().map(|k| k.to_string()).collect();
    let summary = format!("NODE_MISSING: node(s) {} never arrived at the rendezvous", list.join(", "));
    findings.extend(not_ready);
    early_report(meta, nodes, findings, summary)
}

/// The report of a run that failed before any check ran: every selected check not run, the
/// findings that stopped it, and the nodes they name faulty.
pub fn early_report(meta: &RunMeta, nodes: &[NodeInfo], findings: Vec<Finding>, summary: String) -> Report {
    meta.report(nodes, RunStatus::Failed, summary, not_run_checks(meta), findings)
}

fn arrived(nodes: &[NodeInfo], missing: &[usize]) -> String {
    let v: Vec<String> = nodes
        .iter()
        .filter(|n| !missing.contains(&n.node_rank))
        .map(|n| format!("{} ({}, {})", n.node_rank, n.hostname, n.addr))
        .collect();
    v.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> RunMeta {
        RunMeta {
            run_id: "run-1".into(),
            started_at: chrono::Utc::now(),
            settings: Settings::default(),
            backend: DeviceKind::Cpu,
            configs: CheckConfigs::defaults(DeviceKind::Cpu),
            checks: vec![CheckId::Gemm],
        }
    }

    fn nodes() -> Vec<NodeInfo> {
        (0..2)
            .map(|k| NodeInfo { node_rank: k, hostname: format!("n{k}"), addr: format!("10.0.0.{k}"), nproc: 1 })
            .collect()
    }

    /// What every report of a run carries: the run's identity, its nodes and checks, and the
    /// verdicts, here naming `faulty`; and the run failed.
    fn run_parts(r: &Report, meta: &RunMeta, faulty: &[usize]) {
        assert_eq!(r.schema_version, REPORT_SCHEMA_VERSION);
        assert_eq!(r.gpusanity_version, env!("CARGO_PKG_VERSION"));
        assert_eq!((r.run_id.as_str(), r.started_at, r.backend), (meta.run_id.as_str(), meta.started_at, meta.backend));
        assert!(r.finished_at >= r.started_at);
        assert_eq!(r.settings, meta.settings);
        assert_eq!(r.nodes, nodes());
        assert_eq!(r.checks.iter().map(|c| c.name).collect::<Vec<_>>(), meta.checks);
        assert_eq!(r.status, RunStatus::Failed);
        assert_eq!(r.node_verdicts.len(), 2);
        assert_eq!(r.faulty_nodes, faulty, "{:?}", r.node_verdicts);
    }

    #[test]
    fn a_run_stopped_early_and_a_gathered_run_carry_the_same_run_parts() {
        let meta = meta();
        let early = missing_report(&meta, &nodes(), &[1], std::time::Duration::from_secs(5), Vec::new());
        run_parts(&early, &meta, &[1]);
        assert!(early.summary.starts_with("NODE_MISSING"), "{}", early.summary);
        assert!(early.ranks.is_empty() && early.hosts.is_empty() && early.events.is_empty());
        assert_eq!(early.checks[0].status, CheckStatus::NotRun);

        // No node reported: every rank is there, lost.
        let gathered = build_report(&meta, &nodes(), &[Heard::Silent, Heard::Silent], None);
        run_parts(&gathered, &meta, &[0, 1]);
        assert!(gathered.summary.starts_with("NODE_LOST"), "{}", gathered.summary);
        assert_eq!(gathered.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(gathered.checks[0].ranks.len(), 2);
    }

    #[test]
    fn a_node_whose_outcome_is_malformed_is_named_failing_for_it_not_as_silent() {
        let malformed = Heard::Malformed("expected value at line 1 column 1".into());
        let r = build_report(&meta(), &nodes(), &[Heard::Silent, malformed], None);
        assert_eq!(r.status, RunStatus::Failed);
        assert_eq!(r.faulty_nodes, [0, 1], "{:?}", r.node_verdicts);
        let on = |k: usize| r.findings.iter().find(|f| f.node_rank == Some(k) && f.code == Code::NodeLost);
        let silent = on(0).map(|f| f.message.as_str()).unwrap_or_default();
        assert!(silent.contains("never reported its results"), "{silent}");
        let spoke = on(1).map(|f| f.message.as_str()).unwrap_or_default();
        assert!(spoke.contains("malformed outcome: expected value at line 1 column 1"), "{spoke}");
        assert!(!spoke.contains("never reported"), "{spoke}");
    }
}
