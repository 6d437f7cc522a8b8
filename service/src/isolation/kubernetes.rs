//! The Kubernetes isolation backend of the service: NodeIsolated isolates the Node (cordon,
//! taint, label, condition, Event; `gpusanity-kube`), CheckPassed returns the passed nodes it
//! had isolated. An API server that cannot be reached (or answers 429/5xx) is waited out with
//! backoff for as long as the event is younger than `max_event_age_s`, and the offset is stored
//! only after: the change is applied afterwards, and once (isolating an isolated Node changes
//! nothing).
//!
//! A circuit breaker refuses to isolate past `breaker.max_share` of the nodes seen in runs (at
//! least `breaker.min_nodes`) within `breaker.window_s`: a wrong threshold or a failed switch
//! then isolates a few nodes, not the fleet. Its state is in the database, shared by every
//! replica (`gpusanity_db::breaker`: the decision is atomic across them); a refusal is
//! logged as an error, counted (`gpusanity_isolation_actions_total{outcome="refused_by_breaker"}`)
//! and written as a Warning Event `GpusanityIsolationRefused` on the Node, naming the cap and
//! the window.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_db::breaker::{Admission, Limits, Refusal, Settled};
use gpusanity_db::Db;
use gpusanity_kube::{ClientSettings, Effect, Isolator, KubeError, Outcome};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use serde::{Deserialize, Serialize};

use super::{next, request, Request};
use crate::ops::metrics::METRICS;

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
    pub breaker: BreakerSettings,
}

/// `[isolation.kubernetes.breaker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerSettings {
    /// The largest share of the known nodes isolated within the window (0 to 1).
    pub max_share: f64,
    /// Isolations always allowed within the window, whatever the share.
    pub min_nodes: usize,
    pub window_s: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings { max_share: 0.1, min_nodes: 1, window_s: 3600 }
    }
}

impl KubeSettings {
    pub fn check(&self) -> Result<(), String> {
        let b = &self.breaker;
        if !(0.0..=1.0).contains(&b.max_share) || b.window_s == 0 {
            return Err("isolation.kubernetes.breaker: max_share within 0..=1 and window_s > 0".into());
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

impl BreakerSettings {
    /// The database breaker's limits.
    pub fn limits(&self) -> Limits {
        Limits {
            max_share: self.max_share,
            min_nodes: u64::try_from(self.min_nodes).unwrap_or(u64::MAX),
            window_ms: i64::try_from(self.window_s.saturating_mul(1000)).unwrap_or(i64::MAX),
        }
    }

    /// The refusal's words (log, Event).
    pub fn refusal(&self, r: &Refusal) -> String {
        format!(
            "circuit breaker: {} node(s) isolated in the last {} s, the cap is {} ({} of {} known node(s), at least {})",
            r.recent, self.window_s, r.cap, self.max_share, r.known, self.min_nodes
        )
    }
}

/// What the backend needs of the service: the database holding the breaker, this replica's id.
#[derive(Clone)]
pub struct Shared {
    pub db: Db,
    pub replica: String,
}

/// The backend's consumer loop (see the module's description).
pub async fn run(
    consumer: StreamConsumer,
    isolator: Isolator,
    settings: KubeSettings,
    max_age: Duration,
    shared: Shared,
) -> Result<()> {
    tracing::info!(effect = ?settings.taint_effect, "isolation backend: kubernetes");
    loop {
        let m = next(&consumer).await;
        match request(m.payload().unwrap_or_default(), max_age) {
            Ok(Some(r)) => handle(&isolator, &settings.breaker, &shared, r, max_age).await,
            Ok(None) => {}
            Err(why) => tracing::warn!(offset = m.offset(), "isolation backend: {why}"),
        }
        if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
            tracing::warn!(partition = m.partition(), offset = m.offset(), "isolation backend: storing an offset: {e}");
        }
    }
}

async fn handle(isolator: &Isolator, breaker: &BreakerSettings, shared: &Shared, r: Request, max_age: Duration) {
    match r {
        Request::Seen { nodes } => seen(shared, &nodes, max_age).await,
        Request::Isolate { node, codes, reason } => {
            let admitted =
                db_retry(max_age, || shared.db.breaker_admit(&node, &shared.replica, BACKEND, breaker.limits()));
            let slot = match admitted.await {
                Some(Admission::Admitted(slot)) => slot,
                Some(Admission::Refused(r)) => {
                    let why = breaker.refusal(&r);
                    tracing::error!(node, "isolation backend: not isolated: {why}");
                    count("refused_by_breaker");
                    // Where operators look: an Event on the Node (`kubectl describe node`).
                    if let Err(e) = isolator.refused(&node, &why).await {
                        tracing::warn!(node, "isolation backend: recording the refusal on the Node: {e}");
                    }
                    return;
                }
                None => {
                    tracing::error!(
                        node,
                        "isolation backend: not isolated: the circuit breaker's database cannot be reached"
                    );
                    count("failed");
                    return;
                }
            };
            let code = codes.first().cloned().unwrap_or_else(|| "UNKNOWN".into());
            let message = format!("{}: {reason}", codes.join(","));
            let out = retry(max_age, || isolator.isolate(&node, &code, &message)).await;
            let settled = match out {
                Some(Outcome::Isolated(_)) => Settled::Isolated,
                Some(_) => Settled::Unchanged,
                None => Settled::Failed,
            };
            db_retry(max_age, || shared.db.breaker_settle(&slot, settled)).await;
        }
        Request::Return { nodes } => {
            seen(shared, &nodes, max_age).await;
            for node in nodes {
                retry(max_age, || isolator.restore(&node)).await;
            }
        }
    }
}

/// The backend's name in the breaker's table.
const BACKEND: &str = "kubernetes";

async fn seen(shared: &Shared, nodes: &[String], max_age: Duration) {
    db_retry(max_age, || shared.db.breaker_seen(nodes)).await;
}

/// A breaker query until it succeeds or `limit` has passed (a database outage is waited out as
/// the API server's is); `None` after, logged.
async fn db_retry<T, F, Fut>(limit: Duration, mut op: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, gpusanity_db::DbError>>,
{
    let start = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        match op().await {
            Ok(v) => return Some(v),
            Err(e) if start.elapsed() < limit => {
                let wait = backoff.step();
                tracing::warn!(
                    "isolation backend: the circuit breaker's database: {e}; retrying in {} ms",
                    wait.as_millis()
                );
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::error!("isolation backend: the circuit breaker's database: {e}");
                return None;
            }
        }
    }
}

fn count(outcome: &str) {
    METRICS.isolation_actions.with_label_values(&[outcome]).inc();
}

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
    fn the_limits_and_the_refusal_name_the_cap_and_the_window() {
        let b = BreakerSettings { max_share: 0.2, min_nodes: 1, window_s: 60 };
        assert_eq!(b.limits(), Limits { max_share: 0.2, min_nodes: 1, window_ms: 60_000 });
        let why = b.refusal(&Refusal { recent: 2, cap: 2, known: 10 });
        assert!(why.contains("the cap is 2") && why.contains("last 60 s") && why.contains("of 10 known"), "{why}");
        let huge = BreakerSettings { window_s: u64::MAX, min_nodes: usize::MAX, ..b };
        assert_eq!((huge.limits().window_ms, huge.limits().min_nodes), (i64::MAX, u64::MAX));
    }

    #[test]
    fn settings_are_checked() {
        let s: KubeSettings = toml::from_str("taint_effect = \"NoExecute\"\n[breaker]\nmax_share = 0.5").unwrap();
        assert_eq!(s.taint_effect, Effect::NoExecute);
        assert!(s.check().is_ok());
        let bad =
            KubeSettings { breaker: BreakerSettings { max_share: 2.0, ..Default::default() }, ..Default::default() };
        assert!(bad.check().is_err());
        assert!(toml::from_str::<KubeSettings>("taint_effect = \"Evict\"").is_err());
    }
}
