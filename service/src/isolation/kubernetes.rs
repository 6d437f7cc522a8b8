//! The Kubernetes isolation backend of the service: NodeIsolated isolates the Node (cordon,
//! taint, label, condition, Event; `gpusanity-kube`), CheckPassed returns the passed nodes it
//! had isolated. An API server that cannot be reached (or answers 429/5xx) is waited out with
//! backoff for as long as the event is younger than `max_event_age_s`, and the offset is stored
//! only after: the change is applied afterwards, and once (isolating an isolated Node changes
//! nothing).
//!
//! Each isolation asks the circuit breaker first ([`super::breaker`]); a refusal is also written
//! as a Warning Event `GpusanityIsolationRefused` on the Node, naming the cap and the window.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_db::breaker::Settled;
use gpusanity_kube::{ClientSettings, Effect, Isolator, KubeError, Outcome};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use serde::{Deserialize, Serialize};

use super::breaker::{count, Breaker, BreakerSettings, Gate};
use super::{next, request, Request};

/// `[isolation.kubernetes]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct KubeSettings {
    /// A kubeconfig file; without it and without `api_server`: `$KUBECONFIG`, `~/.kube/config`,
    /// then the pod's service account (in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL (with `ca_file` and `token_file`), instead of a kubeconfig.
    pub api_server: Option<String>,
    pub ca_file: Option<PathBuf>,
    /// A bearer token file replacing the kubeconfig user's credentials.
    pub token_file: Option<PathBuf>,
    /// `NoSchedule` (default) or `NoExecute` (also evicts running pods without a toleration).
    pub taint_effect: Effect,
    /// The circuit breaker's settings as they were first spelled, here; `[isolation.breaker]`
    /// now, for every backend (both at once are refused).
    pub breaker: Option<BreakerSettings>,
}

impl KubeSettings {
    pub fn check(&self) -> Result<(), String> {
        if let Some(b) = &self.breaker {
            b.check("isolation.kubernetes.breaker")?;
        }
        if self.api_server.is_some() && self.kubeconfig.is_some() {
            return Err("isolation.kubernetes: api_server or kubeconfig, not both".into());
        }
        Ok(())
    }

    pub fn client_settings(&self) -> ClientSettings {
        ClientSettings {
            kubeconfig: self.kubeconfig.clone(),
            api_server: self.api_server.clone(),
            ca_file: self.ca_file.clone(),
            token_file: self.token_file.clone(),
        }
    }
}

/// The backend's consumer loop (see the module's description).
pub async fn run(consumer: StreamConsumer, isolator: Isolator, settings: KubeSettings, breaker: Breaker) -> Result<()> {
    tracing::info!(effect = ?settings.taint_effect, "isolation backend: kubernetes");
    loop {
        let m = next(&consumer).await;
        match request(m.payload().unwrap_or_default(), breaker.max_age) {
            Ok(Some(r)) => handle(&isolator, &breaker, r).await,
            Ok(None) => {}
            Err(why) => tracing::warn!(offset = m.offset(), "isolation backend: {why}"),
        }
        if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
            tracing::warn!(partition = m.partition(), offset = m.offset(), "isolation backend: storing an offset: {e}");
        }
    }
}

async fn handle(isolator: &Isolator, breaker: &Breaker, r: Request) {
    let max_age = breaker.max_age;
    match r {
        Request::Seen { nodes } => breaker.seen(&nodes).await,
        Request::Isolate { node, codes, reason } => {
            let slot = match breaker.admit(&node, BACKEND).await {
                Gate::Open(slot) => slot,
                Gate::Refused(why) => {
                    // Where operators look: an Event on the Node (`kubectl describe node`).
                    if let Err(e) = isolator.refused(&node, &why).await {
                        tracing::warn!(node, "isolation backend: recording the refusal on the Node: {e}");
                    }
                    return;
                }
                Gate::Unreachable => return,
            };
            let code = codes.first().map_or("UNKNOWN", |c| c.as_str());
            let names: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
            let message = format!("{}: {reason}", names.join(","));
            let out = retry(max_age, || isolator.isolate(&node, code, &message)).await;
            let settled = match out {
                Some(Outcome::Isolated(_)) => Settled::Isolated,
                Some(_) => Settled::Unchanged,
                None => Settled::Failed,
            };
            breaker.settle(&slot, settled).await;
        }
        Request::Return { nodes } => {
            breaker.seen(&nodes).await;
            for node in nodes {
                retry(max_age, || isolator.restore(&node)).await;
            }
        }
    }
}

/// The backend's name in the breaker's table.
const BACKEND: &str = "kubernetes";

/// `op` until it succeeds, a refusal, or `limit` of transient failures (the service's backoff:
/// 100 ms, doubling, at most 5 s).
async fn retry<F, Fut>(limit: Duration, mut op: F) -> Option<Outcome>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Outcome, KubeError>>,
{
    let start = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        match op().await {
            Ok(out) => {
                tracing::info!("isolation backend: {out:?}");
                count(match &out {
                    Outcome::Isolated(_) => "isolated",
                    Outcome::AlreadyIsolated => "already_isolated",
                    Outcome::Returned(_) => "returned",
                    Outcome::NotOurs => "not_ours",
                });
                return Some(out);
            }
            Err(e) if e.is_transient() && start.elapsed() < limit => {
                let wait = backoff.step();
                tracing::warn!("isolation backend: {e}; retrying in {} ms", wait.as_millis());
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::error!("isolation backend: {e}");
                count("failed");
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        let s: KubeSettings = toml::from_str("taint_effect = \"NoExecute\"\n[breaker]\nmax_share = 0.5").unwrap();
        assert_eq!(s.taint_effect, Effect::NoExecute);
        assert_eq!(s.breaker.as_ref().map(|b| b.max_share), Some(0.5));
        assert!(s.check().is_ok());
        let bad = KubeSettings {
            breaker: Some(BreakerSettings { max_share: 2.0, ..Default::default() }),
            ..Default::default()
        };
        assert!(bad.check().is_err());
        assert!(toml::from_str::<KubeSettings>("taint_effect = \"Evict\"").is_err());
    }
}
