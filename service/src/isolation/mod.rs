//! The isolation backend: acts on `NodeIsolated` (the output topic's event for the ops
//! workflow, which stays as it is) by draining the node through Slurm, with the same code as
//! `gpusanity check --slurm-drain` (`gpusanity-slurm`), or by isolating the Kubernetes Node
//! (`gpusanity-kube`, [`kubernetes`]); and on `CheckPassed` by returning the passed nodes it had
//! isolated (a Slurm drain with gpusanity's reason prefix; a Node carrying gpusanity's record).
//! Off by default (`[isolation] backend = "slurm"` or `"kubernetes"` turns it on); `dry_run =
//! true` logs the scontrol command instead of running it, or sends the Kubernetes writes with
//! `dryRun=All` (checked by the API server, stored nowhere).
//!
//! It reads the output topic in a consumer group of its own (`GROUP-isolation`): with several
//! replicas of the service each event is acted on once, and a restart goes on from the group's
//! committed offset (nothing published meanwhile is missed). Events older than
//! `max_event_age_s` are skipped, so that turning the backend on (a new group reads the topic
//! from its start) never drains the nodes of old runs.

pub mod kubernetes;

use std::time::Duration;

use anyhow::Result;
use gpusanity_bus::kafka::{KafkaConn, ReadErrors};
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_slurm::{drain_reason, Action, Scontrol, DEFAULT_PREFIX};
use kubernetes::KubeSettings;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IsolationBackend {
    /// NodeIsolated is published only.
    #[default]
    None,
    /// NodeIsolated also drains the node through scontrol.
    Slurm,
    /// NodeIsolated also cordons, taints, labels and conditions the Kubernetes Node.
    Kubernetes,
}

/// `[isolation]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationConfig {
    pub backend: IsolationBackend,
    /// Log `scontrol update ...` instead of running it.
    pub dry_run: bool,
    /// The reason prefix that marks gpusanity's drains (a passing check resumes only those).
    pub reason_prefix: String,
    /// The scontrol program (on PATH, or a path).
    pub scontrol: String,
    /// Events older than this (seconds) are not acted on (a backlog after an outage).
    pub max_event_age_s: u64,
    /// `[isolation.kubernetes]`: the API server and the taint's effect.
    pub kubernetes: KubeSettings,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            backend: IsolationBackend::None,
            dry_run: false,
            reason_prefix: DEFAULT_PREFIX.into(),
            scontrol: "scontrol".into(),
            max_event_age_s: 3600,
            kubernetes: KubeSettings::default(),
        }
    }
}

impl IsolationConfig {
    /// The scontrol runner when the Slurm backend is on.
    pub fn scontrol(&self) -> Result<Option<Scontrol>, String> {
        match self.backend {
            IsolationBackend::None | IsolationBackend::Kubernetes => Ok(None),
            IsolationBackend::Slurm => Scontrol::new(&self.scontrol, &self.reason_prefix, self.dry_run)
                .map(Some)
                .map_err(|e| format!("isolation.reason_prefix: {e}")),
        }
    }
}

/// What one output-topic message asks of the backend: a drain for a recent NodeIsolated,
/// nothing for the other events (or a malformed or stale one, with why).
pub fn action(payload: &[u8], prefix: &str, max_age: Duration) -> Result<Vec<Action>, String> {
    Ok(match request(payload, max_age)? {
        Some(Request::Isolate { node, codes, reason }) => {
            vec![Action::Drain { node, reason: drain_reason(prefix, &codes, &reason) }]
        }
        Some(Request::Return { nodes }) => nodes.into_iter().map(|node| Action::ResumeIfOurs { node }).collect(),
        Some(Request::Seen { .. }) | None => Vec::new(),
    })
}

/// What an output event asks of any backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A NodeIsolated: its node, its codes (each once), its reason.
    Isolate { node: String, codes: Vec<String>, reason: String },
    /// A CheckPassed: its nodes are returned to service if gpusanity isolated them.
    Return { nodes: Vec<String> },
    /// A SanityCheckStarted: the nodes of a run (the circuit breaker's count of the fleet).
    Seen { nodes: Vec<String> },
}

/// The request of one output-topic message: NodeIsolated and CheckPassed (with nodes) when
/// recent; nothing for the other events; a malformed or stale event says why.
pub fn request(payload: &[u8], max_age: Duration) -> Result<Option<Request>, String> {
    let ev: OutputEvent = serde_json::from_slice(payload).map_err(|e| format!("not an output event: {e}"))?;
    let kind = ev.body.type_name();
    let req = match ev.body {
        OutputBody::NodeIsolated { node, codes, reason, .. } => {
            let mut unique: Vec<String> = Vec::new();
            for c in codes {
                if !unique.contains(&c) {
                    unique.push(c);
                }
            }
            Request::Isolate { node, codes: unique, reason }
        }
        OutputBody::CheckPassed { passed_nodes, .. } if !passed_nodes.is_empty() => {
            Request::Return { nodes: passed_nodes }
        }
        OutputBody::SanityCheckStarted { nodes, .. } => return Ok(Some(Request::Seen { nodes })),
        _ => return Ok(None),
    };
    let age = (chrono::Utc::now() - ev.at).to_std().unwrap_or_default();
    if age > max_age {
        return Err(format!("{} {} is {} s old: not acted on", kind, ev.event_id, age.as_secs()));
    }
    Ok(Some(req))
}

/// The backend's consumer in `group`: offsets committed only for the events handled.
pub fn subscribe(conn: &KafkaConn, group: &str, topic: &str) -> Result<StreamConsumer> {
    let c = gpusanity_bus::kafka::group_consumer(conn, group)?;
    c.subscribe(&[topic])?;
    Ok(c)
}

/// The next output event; a read error is logged and waited out.
pub(crate) async fn next(consumer: &StreamConsumer) -> rdkafka::message::OwnedMessage {
    let mut errors = ReadErrors::new("output events (isolation backend)");
    loop {
        match consumer.recv().await {
            Ok(m) => {
                errors.message();
                return m.detach();
            }
            Err(e) => errors.error(&e),
        }
    }
}

/// Acts on every NodeIsolated and CheckPassed until the service stops. A failing scontrol is
/// retried three times, then logged as an error (the event stays on the topic for the ops workflow); the
/// offset is stored either way, so one bad node never holds up the others.
pub async fn run(consumer: StreamConsumer, scontrol: Scontrol, max_age: Duration) -> Result<()> {
    tracing::info!(dry_run = scontrol.dry_run, prefix = scontrol.prefix, "isolation backend: slurm");
    loop {
        let m = next(&consumer).await;
        match action(m.payload().unwrap_or_default(), &scontrol.prefix, max_age) {
            Ok(actions) => {
                for a in actions {
                    apply(&scontrol, a).await;
                }
            }
            Err(why) => tracing::warn!(offset = m.offset(), "isolation backend: {why}"),
        }
        if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
            tracing::warn!(partition = m.partition(), offset = m.offset(), "isolation backend: storing an offset: {e}");
        }
    }
}

async fn apply(scontrol: &Scontrol, action: Action) {
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=4 {
        let (s, a) = (scontrol.clone(), action.clone());
        match tokio::task::spawn_blocking(move || s.apply(&a)).await {
            Ok(Ok(outcome)) => {
                tracing::info!("isolation backend: {outcome}");
                return;
            }
            Ok(Err(e)) if attempt < 4 => tracing::warn!(attempt, "isolation backend: {e}; retrying"),
            Ok(Err(e)) => tracing::error!("isolation backend: {e}; giving up on {action:?}"),
            Err(e) => tracing::error!("isolation backend: {e}"),
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: OutputBody, age_s: i64) -> Vec<u8> {
        let ev = OutputEvent {
            version: 1,
            event_id: "e1".into(),
            job_id: "j".into(),
            workspace_id: "w".into(),
            run_id: Some("r1".into()),
            cause_event_id: "c".into(),
            at: chrono::Utc::now() - chrono::Duration::seconds(age_s),
            body,
        };
        serde_json::to_vec(&ev).unwrap()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_node_isolated_event_becomes_a_drain_with_our_prefix_and_sanitised_reason() {
        let body = OutputBody::NodeIsolated {
            node: "node2".into(),
            codes: vec!["WORKER_CRASHED".into(), "WORKER_CRASHED".into(), "TEST\"HANG".into()],
            reason: "critical finding(s) in run r1\n\"quoted\"".into(),
            decision: None,
        };
        let a = action(&event(body, 1), "gpusanity:", HOUR).unwrap();
        let reason = "gpusanity: WORKER_CRASHED,TEST_HANG critical finding(s) in run r1 quoted".to_string();
        assert_eq!(a, [Action::Drain { node: "node2".into(), reason }]);
    }

    #[test]
    fn other_events_are_ignored_and_stale_or_malformed_ones_say_why() {
        let passed = OutputBody::CheckPassed {
            summary: "ok".into(),
            report_url: String::new(),
            backend: None,
            passed_nodes: vec![],
        };
        assert_eq!(action(&event(passed, 1), "gpusanity:", HOUR), Ok(vec![]));
        let nodes = vec!["n1".to_string(), "n2".to_string()];
        let passed = OutputBody::CheckPassed {
            summary: "ok".into(),
            report_url: String::new(),
            backend: None,
            passed_nodes: nodes,
        };
        let resume = |n: &str| Action::ResumeIfOurs { node: n.into() };
        assert_eq!(action(&event(passed, 1), "gpusanity:", HOUR), Ok(vec![resume("n1"), resume("n2")]));
        // An event of an older version, without the node list.
        let old = r#"{"version":1,"event_id":"e","job_id":"j","workspace_id":"w","cause_event_id":"c",
            "at":"2026-01-01T00:00:00Z","type":"CheckPassed","summary":"s","report_url":""}"#;
        assert_eq!(request(old.as_bytes(), Duration::MAX), Ok(None));
        let old = OutputBody::NodeIsolated { node: "n1".into(), codes: vec![], reason: String::new(), decision: None };
        assert!(action(&event(old, 7200), "gpusanity:", HOUR).unwrap_err().contains("old"));
        assert!(action(b"{", "gpusanity:", HOUR).is_err());
    }

    #[test]
    fn off_by_default_and_the_prefix_is_checked() {
        let c = IsolationConfig::default();
        assert_eq!(c.backend, IsolationBackend::None);
        assert!(c.scontrol().unwrap().is_none());
        let on: IsolationConfig = toml::from_str("backend = \"slurm\"\ndry_run = true").unwrap();
        let s = on.scontrol().unwrap().unwrap();
        assert!(s.dry_run && s.prefix == "gpusanity:");
        let bad =
            IsolationConfig { backend: IsolationBackend::Slurm, reason_prefix: "a\"b".into(), ..Default::default() };
        assert!(bad.scontrol().is_err());
        assert!(toml::from_str::<IsolationConfig>("backend = \"lsf\"").is_err());
    }
}
