//! `[watch]` of the service's configuration (docs/watch.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchConfig {
    /// Watch the GPUs of every job whose check passed, until it stops.
    pub enabled: bool,
    /// The agents' sampling interval, seconds.
    pub interval_s: f64,
    /// One summary per node and period, seconds.
    pub period_s: f64,
    /// How long an agent keeps watching without a renewal, seconds.
    pub lease_s: u64,
    /// How often the coordinator renews the watches, seconds.
    pub renew_s: u64,
    /// What a suspicion does besides its NodeSuspected, notification and metric.
    pub policy: WatchPolicy,
    /// The judgement's thresholds.
    pub judge: gpusanity_watch::JudgeConfig,
}

/// What a suspicion does: never an isolation by itself (docs/watch.md, "Policy").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchPolicy {
    /// The event, the notification and the node's page only.
    Notify,
    /// Also check the job at its next restart, even where its timing policy would skip that
    /// restart: the check confirms the node (and isolates it as any failed check does) or clears it.
    CheckAtRestart,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            enabled: true,
            interval_s: 1.0,
            period_s: 5.0,
            lease_s: 30,
            renew_s: 10,
            policy: WatchPolicy::CheckAtRestart,
            judge: Default::default(),
        }
    }
}

impl WatchConfig {
    pub fn interval_ms(&self) -> u32 {
        (self.interval_s * 1000.0).round() as u32
    }

    pub fn period_ms(&self) -> u32 {
        (self.period_s * 1000.0).round() as u32
    }

    pub fn validate(&self) -> Result<(), String> {
        use gpusanity_common::wire::watch::{INTERVAL_MS, MAX_SAMPLES, PERIOD_MS};
        if !(self.interval_s.is_finite() && INTERVAL_MS.contains(&self.interval_ms())) {
            return Err("watch.interval_s must be 0.1 to 60".into());
        }
        if !(self.period_s.is_finite() && PERIOD_MS.contains(&self.period_ms())) {
            return Err("watch.period_s must be 1 to 600".into());
        }
        if self.period_ms() / self.interval_ms() > MAX_SAMPLES as u32 || self.period_ms() < self.interval_ms() {
            return Err(format!("watch.period_s must hold 1 to {MAX_SAMPLES} intervals"));
        }
        if self.renew_s == 0 || self.lease_s < 2 * self.renew_s || self.lease_s > 3600 {
            return Err("watch.lease_s must be at least twice watch.renew_s (at least 1), and at most 3600".into());
        }
        self.judge.validate()
    }
}
