//! The judgement's thresholds (`[watch]` of the service's configuration).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JudgeConfig {
    /// The busy instants a GPU's persistence is judged over.
    pub window: u32,
    /// Of those, how many must be low to suspect the GPU.
    pub min_low: u32,
    /// An SM clock is low when below the median by more than this fraction of it...
    pub clock_gap: f64,
    /// ...and by more than this many scaled median absolute deviations.
    pub mad_k: f64,
    /// A power draw is low when below the median by more than this fraction of it (and by
    /// `mad_k` deviations): wide, since ranks of one job draw unequally.
    pub power_gap: f64,
    /// An enforced power limit is low when below the job's median limit by this fraction.
    pub limit_gap: f64,
    /// A GPU is busy at or above this utilization, percent; an instant is judged when the
    /// median of the job's GPUs is busy.
    pub busy_pct: u8,
    /// The fewest busy GPUs an instant needs to be judged against its peers.
    pub min_peers: usize,
    /// The busy instants a GPU's usual ratio of its SM clock to the job's median is learned
    /// over: averaged over its first `baseline_ticks`, then followed with an exponentially
    /// weighted mean of that memory. Once `min_peers` GPUs of an instant have learned that
    /// many, a GPU whose ratio fell below its usual one by more than both `clock_gap` and
    /// `mad_k` scaled deviations of the GPUs' changes is low too. 0 turns this rule off.
    pub baseline_ticks: u32,
    /// Samples with a hardware slowdown, thermal or power brake that make a busy GPU suspect.
    pub throttle_samples: u32,
    /// PCIe replays in one period that make a GPU suspect.
    pub pcie_replays: u64,
    /// NVLink CRC, replay and recovery errors in one period that make a GPU suspect.
    pub nvlink_errors: u64,
    /// The XIDs that make a GPU suspect (the health check's fatal table by default).
    pub fatal_xids: Vec<u32>,
}

impl Default for JudgeConfig {
    fn default() -> Self {
        JudgeConfig {
            window: 5,
            min_low: 4,
            clock_gap: 0.06,
            mad_k: 5.0,
            power_gap: 0.35,
            limit_gap: 0.05,
            busy_pct: 50,
            min_peers: 4,
            baseline_ticks: 30,
            throttle_samples: 2,
            pcie_replays: 100,
            nvlink_errors: 16,
            fatal_xids: gpusanity_common::health::xid::default_fatal(),
        }
    }
}

impl JudgeConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.window) || !(1..=self.window).contains(&self.min_low) {
            return Err("watch: window must be 1 to 64 and min_low 1 to window".into());
        }
        for (name, v) in [("clock_gap", self.clock_gap), ("power_gap", self.power_gap), ("limit_gap", self.limit_gap)] {
            if !(0.0..1.0).contains(&v) {
                return Err(format!("watch: {name} must be at least 0 and below 1"));
            }
        }
        if !(0.0..=100.0).contains(&self.mad_k) {
            return Err("watch: mad_k must be 0 to 100".into());
        }
        if self.busy_pct > 100 || self.min_peers < 2 || self.min_peers > 4096 {
            return Err("watch: busy_pct must be at most 100 and min_peers 2 to 4096".into());
        }
        if self.baseline_ticks != 0 && !(2..=3600).contains(&self.baseline_ticks) {
            return Err("watch: baseline_ticks must be 0 (off) or 2 to 3600".into());
        }
        if self.fatal_xids.len() > 1024 {
            return Err("watch: at most 1024 fatal XIDs".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_ticks_are_off_or_2_to_3600() {
        for (n, ok) in [(0, true), (1, false), (2, true), (30, true), (3600, true), (3601, false)] {
            let cfg = JudgeConfig { baseline_ticks: n, ..Default::default() };
            assert_eq!(cfg.validate().is_ok(), ok, "{n}");
        }
        let cfg: JudgeConfig = serde_json::from_str(r#"{"baseline_ticks": 60}"#).expect("parses");
        assert_eq!((cfg.baseline_ticks, cfg.window), (60, 5));
        assert_eq!(JudgeConfig::default().baseline_ticks, 30);
    }
}
