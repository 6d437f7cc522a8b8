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
//!
//! Both backends ask the circuit breaker ([`breaker`], `[isolation.breaker]`) before each drain
//! or isolation, and count the nodes of every run they see for it.

pub mod breaker;
pub mod kubernetes;

use std::time::Duration;

use anyhow::Result;
use breaker::{count, Breaker, BreakerSettings, Gate};
use gpusanity_bus::kafka::{KafkaConn, ReadErrors};
use gpusanity_common::report::Code;
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_db::breaker::Settled;
use gpusanity_slurm::{drain_reason, Action, Outcome, Scontrol, DEFAULT_PREFIX};
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
    /// `[isolation.breaker]`: at most this share of the fleet isolated within a window.
    pub breaker: BreakerSettings,
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
            breaker: BreakerSettings::default(),
            kubernetes: KubeSettings::default(),
        }
    }
}

impl IsolationConfig {
    pub fn check(&self) -> Result<(), String> {
        self.breaker.check("isolation.breaker")?;
        if self.kubernetes.breaker.is_some() && self.breaker != BreakerSettings::default() {
            return Err("isolation.breaker and isolation.kubernetes.breaker: one of them, not both".into());
        }
        self.kubernetes.check()
    }

    /// The circuit breaker's settings: `[isolation.breaker]`, or where Kubernetes users first
    /// set them.
    pub fn breaker_settings(&self) -> &BreakerSettings {
        self.kubernetes.breaker.as_ref().unwrap_or(&self.breaker)
    }

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

/// What an output event asks of any backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A NodeIsolated: its node, its codes (each once), its reason.
    Isolate { node: String, codes: Vec<Code>, reason: String },
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
            let mut unique: Vec<Code> = Vec::new();
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

/// Acts on every NodeIsolated and CheckPassed until the service stops. A drain past the
/// circuit breaker's cap is not made. A failing scontrol is retried three times, then logged as
/// an error (the event stays on the topic for the ops workflow); the offset is stored either
/// way, so one bad node never holds up the others.
pub async fn run(consumer: StreamConsumer, scontrol: Scontrol, breaker: Breaker) -> Result<()> {
    tracing::info!(dry_run = scontrol.dry_run, prefix = scontrol.prefix, "isolation backend: slurm");
    loop {
        let m = next(&consumer).await;
        match request(m.payload().unwrap_or_default(), breaker.max_age) {
            Ok(Some(Request::Seen { nodes })) => breaker.seen(&nodes).await,
            Ok(Some(Request::Isolate { node, codes, reason })) => {
                if let Gate::Open(slot) = breaker.admit(&node, "slurm").await {
                    let reason = drain_reason(&scontrol.prefix, &codes, &reason);
                    let settled = match apply(&scontrol, Action::Drain { node, reason }).await {
                        Some(Outcome::Drained { .. }) => Settled::Isolated,
                        Some(_) => Settled::Unchanged,
                        None => Settled::Failed,
                    };
                    breaker.settle(&slot, settled).await;
                }
            }
            Ok(Some(Request::Return { nodes })) => {
                breaker.seen(&nodes).await;
                for node in nodes {
                    apply(&scontrol, Action::ResumeIfOurs { node }).await;
                }
            }
            Ok(None) => {}
            Err(why) => tracing::warn!(offset = m.offset(), "isolation backend: {why}"),
        }
        if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
            tracing::warn!(partition = m.partition(), offset = m.offset(), "isolation backend: storing an offset: {e}");
        }
    }
}

/// `action` through scontrol, tried four times; what it did, or `None` (logged and counted).
async fn apply(scontrol: &Scontrol, action: Action) -> Option<Outcome> {
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=4 {
        let (s, a) = (scontrol.clone(), action.clone());
        match tokio::task::spawn_blocking(move || s.apply(&a)).await {
            Ok(Ok(outcome)) => {
                tracing::info!("isolation backend: {outcome}");
                count(match &outcome {
                    Outcome::Drained { .. } => "isolated",
                    Outcome::AlreadyDrained { .. } => "already_isolated",
                    Outcome::Resumed { .. } => "returned",
                    Outcome::NotOurs { .. } => "not_ours",
                    Outcome::NotDrained { .. } | Outcome::DryRun { .. } => "unchanged",
                });
                return Some(outcome);
            }
            Ok(Err(e)) if attempt < 4 => tracing::warn!(attempt, "isolation backend: {e}; retrying"),
            Ok(Err(e)) => tracing::error!("isolation backend: {e}; giving up on {action:?}"),
            Err(e) => tracing::error!("isolation backend: {e}"),
        }
        tokio::time::sleep(wait).await;
        wait *= 2;
    }
    count("failed");
    None
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
            codes: vec![Code::WorkerCrashed, Code::WorkerCrashed, Code::TestHang],
            reason: "critical finding(s) in run r1\n\"quoted\"".into(),
            decision: None,
            gpus: Vec::new(),
        };
        let Ok(Some(Request::Isolate { node, codes, reason })) = request(&event(body, 1), HOUR) else {
            panic!("not an isolation")
        };
        assert_eq!((node.as_str(), &codes[..]), ("node2", &[Code::WorkerCrashed, Code::TestHang][..]));
        let want = "gpusanity: WORKER_CRASHED,TEST_HANG critical finding(s) in run r1 quoted";
        assert_eq!(drain_reason("gpusanity:", &codes, &reason), want);
        // A code this version does not know is refused with the event, naming it: no drain
        // reason is made of text nobody defined.
        let forged = String::from_utf8(event(
            OutputBody::NodeIsolated {
                node: "node2".into(),
                codes: vec![Code::TestHang],
                reason: String::new(),
                decision: None,
                gpus: Vec::new(),
            },
            1,
        ))
        .unwrap()
        .replace("TEST_HANG", "TEST\\\"HANG");
        let why = request(forged.as_bytes(), HOUR).unwrap_err();
        assert!(why.contains("unknown finding code `TEST\"HANG`"), "{why}");
    }

    #[test]
    fn other_events_are_ignored_and_stale_or_malformed_ones_say_why() {
        let passed = OutputBody::CheckPassed {
            summary: "ok".into(),
            report_url: String::new(),
            backend: None,
            passed_nodes: vec![],
        };
        assert_eq!(request(&event(passed, 1), HOUR), Ok(None));
        let nodes = vec!["n1".to_string(), "n2".to_string()];
        let passed = OutputBody::CheckPassed {
            summary: "ok".into(),
            report_url: String::new(),
            backend: None,
            passed_nodes: nodes,
        };
        let nodes = vec!["n1".to_string(), "n2".to_string()];
        assert_eq!(request(&event(passed, 1), HOUR), Ok(Some(Request::Return { nodes })));
        // An event of an older version, without the node list.
        let old = r#"{"version":1,"event_id":"e","job_id":"j","workspace_id":"w","cause_event_id":"c",
            "at":"2026-01-01T00:00:00Z","type":"CheckPassed","summary":"s","report_url":""}"#;
        assert_eq!(request(old.as_bytes(), Duration::MAX), Ok(None));
        let old = OutputBody::NodeIsolated {
            node: "n1".into(),
            codes: vec![],
            reason: String::new(),
            decision: None,
            gpus: Vec::new(),
        };
        assert!(request(&event(old, 7200), HOUR).unwrap_err().contains("old"));
        assert!(request(b"{", HOUR).is_err());
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

    #[test]
    fn one_breaker_for_every_backend_set_in_one_place() {
        let c: IsolationConfig = toml::from_str("backend = \"slurm\"\n[breaker]\nmax_share = 0.25").unwrap();
        assert!(c.check().is_ok());
        assert_eq!(c.breaker_settings().max_share, 0.25);
        // Where Kubernetes users first set it, still read.
        let old: IsolationConfig = toml::from_str("[kubernetes.breaker]\nmax_share = 0.3").unwrap();
        assert!(old.check().is_ok());
        assert_eq!(old.breaker_settings().max_share, 0.3);
        let both: IsolationConfig =
            toml::from_str("[breaker]\nmax_share = 0.2\n[kubernetes.breaker]\nmax_share = 0.3").unwrap();
        assert!(both.check().unwrap_err().contains("not both"));
        let bad: IsolationConfig = toml::from_str("[breaker]\nwindow_s = 0").unwrap();
        assert!(bad.check().unwrap_err().contains("isolation.breaker"));
    }
}
