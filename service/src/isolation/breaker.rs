//! The circuit breaker every isolation backend asks before it drains or isolates a node
//! (`[isolation.breaker]`): at most `max_share` of the nodes seen in runs (at least
//! `min_nodes`) within `window_s`, so that a wrong threshold or a failed switch that makes every
//! node fail does not take the fleet down. The count is shared by every replica
//! (`gpusanity_db::breaker`: the decision is atomic across them). A refusal is logged as an
//! error and counted (`gpusanity_isolation_actions_total{outcome="refused_by_breaker"}`); the
//! backend may record it where its operators look (a Kubernetes Event). A database outage is
//! waited out up to the backend's `max_event_age_s`; past it the node is not isolated.

use std::time::{Duration, Instant};

use gpusanity_bus::backoff::Backoff;
use gpusanity_db::breaker::{Admission, Limits, Refusal, Settled, Slot};
use gpusanity_db::Db;
use serde::{Deserialize, Serialize};

use crate::ops::metrics::METRICS;

/// `[isolation.breaker]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerSettings {
    /// The largest share of the known nodes isolated within the window (0 to 1).
    pub max_share: f64,
    /// Isolations always allowed within the window, whatever the share.
    pub min_nodes: usize,
    pub window_s: u64,
    /// A node not seen in a run for this long no longer counts as known (30 days).
    pub forget_s: u64,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings { max_share: 0.1, min_nodes: 1, window_s: 3600, forget_s: 30 * 86_400 }
    }
}

impl BreakerSettings {
    pub fn check(&self, name: &str) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.max_share) || self.window_s == 0 || self.forget_s == 0 {
            return Err(format!("{name}: max_share within 0..=1, window_s > 0 and forget_s > 0"));
        }
        Ok(())
    }

    /// The database breaker's limits.
    pub fn limits(&self) -> Limits {
        let ms = |s: u64| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Limits {
            max_share: self.max_share,
            min_nodes: u64::try_from(self.min_nodes).unwrap_or(u64::MAX),
            window_ms: ms(self.window_s),
            forget_ms: ms(self.forget_s),
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

/// What a backend needs of the service for its breaker: the database, this replica's id, the
/// settings, and how long a database outage is waited out.
#[derive(Clone)]
pub struct Breaker {
    pub db: Db,
    pub replica: String,
    pub settings: BreakerSettings,
    pub max_age: Duration,
}

/// The breaker's answer to one isolation.
pub enum Gate {
    /// Go on, then [`Breaker::settle`] the slot.
    Open(Slot),
    /// Past the cap: not isolated, with why (logged and counted already).
    Refused(String),
    /// The database could not be reached within `max_age`: not isolated (logged and counted).
    Unreachable,
}

impl Breaker {
    /// Asks for a slot to isolate `node` through `backend` (`slurm`, `kubernetes`).
    pub async fn admit(&self, node: &str, backend: &str) -> Gate {
        let limits = self.settings.limits();
        match self.retry(|| self.db.breaker_admit(node, &self.replica, backend, limits)).await {
            Some(Admission::Admitted(slot)) => Gate::Open(slot),
            Some(Admission::Refused(r)) => {
                let why = self.settings.refusal(&r);
                tracing::error!(node, backend, "isolation backend: not isolated: {why}");
                count("refused_by_breaker");
                Gate::Refused(why)
            }
            None => {
                tracing::error!(
                    node,
                    "isolation backend: not isolated: the circuit breaker's database cannot be reached"
                );
                count("failed");
                Gate::Unreachable
            }
        }
    }

    /// What became of the isolation of `slot`.
    pub async fn settle(&self, slot: &Slot, settled: Settled) {
        self.retry(|| self.db.breaker_settle(slot, settled)).await;
    }

    /// Records the nodes of a run: they count towards the fleet.
    pub async fn seen(&self, nodes: &[String]) {
        self.retry(|| self.db.breaker_seen(nodes)).await;
    }

    /// A breaker query until it succeeds or `max_age` has passed (a database outage is waited
    /// out as the backend's own is); `None` after, logged.
    async fn retry<T, F, Fut>(&self, mut op: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, gpusanity_db::DbError>>,
    {
        let start = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            match op().await {
                Ok(v) => return Some(v),
                Err(e) if start.elapsed() < self.max_age => {
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
}

/// Counts one action of an isolation backend by its outcome.
pub fn count(outcome: &str) {
    METRICS.isolation_actions.with_label_values(&[outcome]).inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_and_the_refusal_name_the_cap_and_the_window() {
        let b = BreakerSettings { max_share: 0.2, min_nodes: 1, window_s: 60, forget_s: 120 };
        assert_eq!(b.limits(), Limits { max_share: 0.2, min_nodes: 1, window_ms: 60_000, forget_ms: 120_000 });
        let why = b.refusal(&Refusal { recent: 2, cap: 2, known: 10 });
        assert!(why.contains("the cap is 2") && why.contains("last 60 s") && why.contains("of 10 known"), "{why}");
        let huge = BreakerSettings { window_s: u64::MAX, min_nodes: usize::MAX, forget_s: u64::MAX, ..b };
        assert_eq!((huge.limits().window_ms, huge.limits().min_nodes), (i64::MAX, u64::MAX));
    }

    #[test]
    fn settings_are_checked() {
        let s: BreakerSettings = toml::from_str("max_share = 0.5").unwrap();
        assert!(s.check("isolation.breaker").is_ok());
        assert_eq!(s.window_s, 3600);
        for bad in [
            BreakerSettings { max_share: 2.0, ..Default::default() },
            BreakerSettings { max_share: f64::NAN, ..Default::default() },
            BreakerSettings { window_s: 0, ..Default::default() },
            BreakerSettings { forget_s: 0, ..Default::default() },
        ] {
            assert!(bad.check("isolation.breaker").unwrap_err().contains("isolation.breaker"), "{bad:?}");
        }
        assert!(toml::from_str::<BreakerSettings>("max_shar = 0.5").is_err());
    }
}
