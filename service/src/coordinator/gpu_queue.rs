//! One run per GPU at a time (docs/service.md, "Shared nodes"): a run whose GPUs on some node
//! may be those of an earlier run still in Checking waits before its first task goes out, its
//! summary and transitions saying for which run and where; runs on disjoint GPUs go side by
//! side. The order is the runs' creation (then their ids), the same for every replica, so no
//! two runs ever wait for each other. The wait is bounded by the run's max time; once it
//! starts, its deadline is its whole max time from then.

use std::collections::HashMap;

use anyhow::Result;
use gpusanity_common::report::{Code, Finding, Scope, Severity};
use gpusanity_common::wire::gpu_id::may_share;
use gpusanity_db::rows::RunRow;

use super::{Active, Coordinator, Phase};

/// Where `later` would meet `earlier`: the first node both use with GPUs that may be the same.
pub(super) fn meeting(later: &RunRow, earlier: &RunRow) -> Option<String> {
    later.nodes.iter().find_map(|n| {
        let other = earlier.nodes.iter().find(|m| m.name == n.name)?;
        may_share(&n.gpu_ids, &other.gpu_ids).then(|| n.name.clone())
    })
}

/// Why `run` must wait: the earliest run of `checking` (runs in Checking) created before it
/// whose GPUs it may share.
pub(super) fn blocker(run: &RunRow, checking: &[RunRow]) -> Option<String> {
    checking
        .iter()
        .filter(|b| b.run_id != run.run_id && (b.created_at, &b.run_id) < (run.created_at, &run.run_id))
        .find_map(|b| {
            meeting(run, b).map(|node| format!("waiting for the GPUs of node {node}: run {} holds them", b.run_id))
        })
}

impl Coordinator {
    /// The runs of this replica about to send their first task that must wait, and why.
    pub(super) async fn gpu_blockers(&self) -> Result<HashMap<String, String>> {
        let waiting: Vec<&Active> = self.active.values().filter(|a| a.phase == Phase::WaitAgents).collect();
        if waiting.is_empty() {
            return Ok(HashMap::new());
        }
        let checking = self.db.active_runs().await?;
        Ok(waiting
            .into_iter()
            .filter_map(|a| blocker(&a.run, &checking).map(|why| (a.run.run_id.clone(), why)))
            .collect())
    }

    /// Records that a run waits for GPUs (its summary and a transition), or that it starts
    /// after waiting with its deadline `deadline_at`.
    pub(super) async fn record_gpu_wait(&self, run_id: &str, why: Option<&str>, deadline_at: i64) -> Result<()> {
        match why {
            Some(why) => {
                tracing::info!(run_id, "{why}");
                Ok(self.db.set_waiting(run_id, why).await?)
            }
            None => {
                tracing::info!(run_id, "the run's GPUs are free: starting");
                Ok(self.db.start_after_wait(run_id, deadline_at).await?)
            }
        }
    }
}

/// A run that waited for GPUs starts now: its deadline is its whole max time from now.
pub(super) fn restart_clock(a: &mut Active, now_ms: i64) {
    let window = a.run.deadline_at.saturating_sub(a.run.created_at);
    a.run.deadline_at = now_ms.saturating_add(window);
}

/// A run that waited its whole max time for GPUs: the run overran, and no node is to blame.
pub(super) fn waited_too_long(why: &str) -> (String, Finding) {
    let summary = format!("{why}, for the run's whole max time: no check ran");
    let mut f = Finding::new(Severity::Critical, Code::RunTimeout, Scope::Service, summary.clone());
    f.action =
        Some("check the run that holds the GPUs (held by KeepJobHang, or hung); then start the job again".into());
    (summary, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::wire::job::JobNode;

    fn run(id: &str, created_at: i64, nodes: &[(&str, &[&str])]) -> RunRow {
        let nodes = nodes
            .iter()
            .map(|(name, ids)| JobNode {
                name: name.to_string(),
                address: "127.0.0.1".into(),
                gpus: ids.len().max(1) as u32,
                gpu_ids: ids.iter().map(|i| i.parse().unwrap()).collect(),
            })
            .collect();
        RunRow {
            run_id: id.into(),
            job_id: format!("job-{id}"),
            workspace_id: "w".into(),
            attempt: 0,
            cause_event_id: "e".into(),
            nodes,
            check_args: String::new(),
            settings: serde_json::json!({}),
            state: gpusanity_db::rows::ServiceRunState::Checking,
            held: false,
            created_at,
            deadline_at: created_at + 60_000,
            finished_at: None,
            summary: String::new(),
        }
    }

    #[test]
    fn a_later_run_waits_for_an_earlier_one_on_the_same_gpus_and_never_the_other_way() {
        let a = run("a", 10, &[("n1", &["0", "1"]), ("n2", &[])]);
        let b = run("b", 20, &[("n1", &["1", "2"])]);
        let c = run("c", 30, &[("n1", &["4", "5"])]);
        let d = run("d", 40, &[("n2", &["3"])]);
        let all = [a.clone(), b.clone(), c.clone(), d.clone()];
        assert_eq!(blocker(&a, &all), None, "the earliest waits for nobody");
        assert!(blocker(&b, &all).unwrap().contains("run a"), "{:?}", blocker(&b, &all));
        assert_eq!(blocker(&c, &all), None, "disjoint GPUs go side by side");
        let why = blocker(&d, &all).unwrap();
        assert!(why.contains("node n2") && why.contains("run a"), "a whole-node run holds every GPU: {why}");
        // The same creation time: the run ids decide, the same way on every replica.
        let e = run("e", 20, &[("n1", &["1"])]);
        assert!(blocker(&e, &[b.clone(), e.clone()]).is_some());
        assert!(blocker(&b, &[b.clone(), e]).is_none());
    }
}
