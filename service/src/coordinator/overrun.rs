//! The coordinator's own overrun: no verdict at `--sanity-check-max-time` plus
//! `deadline_grace_s`. As the launcher names the ranks that did not finish when it stops a run
//! at its max time, the service names the nodes whose launchers had not ended (no `Result`
//! from them): a `RUN_UNFINISHED` finding per node, critical, so a failed run isolates them
//! (NodeIsolated), beside the run's `RUN_TIMEOUT`.

use gpusanity_common::report::{Code, Finding, Scope, Severity};

use super::agents::Agents;
use super::finish::node_finding;
use super::Active;

/// The summary and findings of run `a` overrunning its deadline (its verdict is
/// [`gpusanity_common::verdict::Stop::Overran`]'s: held under KeepJobHang, else timed out).
pub(super) fn ending(a: &Active, agents: &Agents) -> (String, Vec<Finding>) {
    // A run that waited for its GPUs all along sent no task: no node is to blame.
    if let Some(why) = &a.gpus_busy {
        let (summary, finding) = super::gpu_queue::waited_too_long(why);
        return (summary, vec![finding]);
    }
    let limit = a.settings.max_time_minutes;
    let unfinished: Vec<usize> = (0..a.run.nodes.len()).filter(|k| !a.results.contains_key(k)).collect();
    let names: Vec<&str> = unfinished.iter().filter_map(|&k| a.run.nodes.get(k).map(|n| n.name.as_str())).collect();
    let mut summary = format!("the run overran --sanity-check-max-time ({limit} min) and no verdict came from node 0");
    if !names.is_empty() {
        summary = format!("{summary}; not finished: node(s) {}", names.join(", "));
    }
    let mut findings = vec![Finding::new(Severity::Critical, Code::RunTimeout, Scope::Service, summary.clone())];
    for &k in &unfinished {
        let name = a.run.nodes.get(k).map(|n| n.name.as_str()).unwrap_or_default();
        let state = match agents.known(name) {
            Some(s) if a.assigned.get(&k).is_some_and(|id| id == &s.agent_id) => "its launcher was still running",
            Some(_) => "its task went to an agent that is gone",
            None => "its agent was never heard from",
        };
        let message = format!(
            "node {name} (node rank {k}) had not finished when the run overran --sanity-check-max-time ({limit} min): {state}"
        );
        let mut f = node_finding(&a.run, k, Code::RunUnfinished, message);
        f.check = Scope::Service;
        findings.push(f);
    }
    (summary, findings)
}
