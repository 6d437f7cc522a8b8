//! The watch while a job runs (docs/watch.md): the coordinator asks the agents of a job whose
//! check passed to sample the job's GPUs ([`WatchTask`], a command on the agent-tasks topic),
//! each agent publishes one [`Telemetry`] per node and period on the telemetry topic (signed like
//! every agent message), and the service's judgement names a node it suspects in a
//! `NodeSuspected` output event with a [`SuspectCode`].
//!
//! Every list here is bounded ([`Telemetry::validate`]): a summary is read from a topic anyone
//! with a key may write, and one node's summary must never cost the service more than a few
//! kilobytes.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::wire::gpu_id::GpuId;

/// The most samples of one GPU in one summary (a period of at most 64 intervals).
pub const MAX_SAMPLES: usize = 64;
/// The most GPUs of one node in one summary.
pub const MAX_GPUS: usize = 64;
/// The most XIDs of one GPU in one summary (a storm of one XID says no more).
pub const MAX_XIDS: usize = 16;
/// The most foreign processes named per GPU and summary.
pub const MAX_FOREIGN: usize = 16;
/// The longest process name kept.
pub const MAX_NAME: usize = 64;
/// The shortest and longest sampling interval and period an agent accepts, milliseconds.
pub const INTERVAL_MS: std::ops::RangeInclusive<u32> = 100..=60_000;
pub const PERIOD_MS: std::ops::RangeInclusive<u32> = 1_000..=600_000;

/// Sample the job's GPUs on this node until `until` (renewed by the coordinator while the job
/// runs) or an [`CommandBody::Unwatch`](crate::wire::agent::CommandBody::Unwatch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchTask {
    pub job_id: String,
    /// The run whose check passed: the summaries name it.
    pub run_id: String,
    /// The job's GPUs on the node (the job event's `gpu_ids`); empty: every GPU of the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_ids: Vec<GpuId>,
    /// Sampling interval, milliseconds ([`INTERVAL_MS`]).
    pub interval_ms: u32,
    /// One summary per period, milliseconds ([`PERIOD_MS`]); periods end on multiples of it in
    /// wall-clock time, so that the nodes of a job publish together.
    pub period_ms: u32,
    /// The agent stops sampling at this instant unless the task is renewed: a job the service
    /// lost track of is not watched forever.
    pub until: DateTime<Utc>,
}

/// Why a [`WatchTask`] is refused by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BadWatch {
    #[error("interval {0} ms outside {min}..={max} ms", min = INTERVAL_MS.start(), max = INTERVAL_MS.end())]
    Interval(u32),
    #[error("period {0} ms outside {min}..={max} ms", min = PERIOD_MS.start(), max = PERIOD_MS.end())]
    Period(u32),
    #[error("period {period_ms} ms holds more than {MAX_SAMPLES} samples of {interval_ms} ms")]
    TooManySamples { interval_ms: u32, period_ms: u32 },
    #[error("{0} GPUs named, at most {MAX_GPUS}")]
    TooManyGpus(usize),
    #[error("job id of {0} bytes (1 to 256)")]
    JobId(usize),
    #[error("run id of {0} bytes (1 to 256)")]
    RunId(usize),
}

/// Whether `id` (a job's, a run's, a node's, an agent's, a GPU's) is of 1 to 256 bytes, as
/// every name of the watch's wire is.
pub fn id_in_bounds(id: &str) -> bool {
    (1..=256).contains(&id.len())
}

impl WatchTask {
    pub fn validate(&self) -> Result<(), BadWatch> {
        if !id_in_bounds(&self.job_id) {
            return Err(BadWatch::JobId(self.job_id.len()));
        }
        if !id_in_bounds(&self.run_id) {
            return Err(BadWatch::RunId(self.run_id.len()));
        }
        if !INTERVAL_MS.contains(&self.interval_ms) {
            return Err(BadWatch::Interval(self.interval_ms));
        }
        if !PERIOD_MS.contains(&self.period_ms) {
            return Err(BadWatch::Period(self.period_ms));
        }
        if self.period_ms / self.interval_ms > MAX_SAMPLES as u32 {
            return Err(BadWatch::TooManySamples { interval_ms: self.interval_ms, period_ms: self.period_ms });
        }
        if self.gpu_ids.len() > MAX_GPUS {
            return Err(BadWatch::TooManyGpus(self.gpu_ids.len()));
        }
        Ok(())
    }
}

/// One node's summary of one period, on the telemetry topic (keyed by job id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    pub version: u32,
    pub node: String,
    pub agent_id: String,
    pub job_id: String,
    pub run_id: String,
    /// The period's first sample's instant; sample `i` was taken at `from + i x interval_ms`.
    pub from: DateTime<Utc>,
    pub interval_ms: u32,
    pub gpus: Vec<GpuTelemetry>,
}

/// One GPU over one period. Per-sample series hold one value per interval (a sample the
/// driver could not give is `null`); the rest are what changed over the period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuTelemetry {
    /// The GPU's UUID as NVML gives it.
    pub gpu: String,
    /// SM clock, MHz, per sample.
    pub sm_mhz: Vec<Option<u32>>,
    /// Power draw, watts, per sample.
    pub power_w: Vec<Option<f32>>,
    /// GPU utilization, percent, per sample.
    pub util_pct: Vec<Option<u8>>,
    /// The enforced power limit, watts (last sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f32>,
    /// Highest GPU temperature, degrees C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_max_c: Option<u32>,
    /// Memory used, MiB (last sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used_mib: Option<u64>,
    /// Samples during which each clock-event reason was active.
    #[serde(default, skip_serializing_if = "Throttle::is_clear")]
    pub throttle: Throttle,
    /// Counter increases over the period.
    #[serde(default, skip_serializing_if = "Counters::is_zero")]
    pub counters: Counters,
    /// XIDs raised in the period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<u64>,
    /// Processes computing on the GPU that are not the job's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<ForeignProcess>,
}

/// Samples during which a clock-event reason was active (the `SW power cap` that every GPU at
/// its power limit shows is counted, not judged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Throttle {
    pub hw_slowdown: u32,
    pub hw_thermal: u32,
    pub hw_power_brake: u32,
    pub sw_thermal: u32,
    pub sw_power_cap: u32,
}

impl Throttle {
    pub fn is_clear(&self) -> bool {
        *self == Throttle::default()
    }
}

/// Counter increases over one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Counters {
    pub ecc_uncorrected: u64,
    pub remapped_uncorrectable: u64,
    pub pcie_replay: u64,
    /// CRC, replay and recovery errors of every NVLink.
    pub nvlink_errors: u64,
}

impl Counters {
    pub fn is_zero(&self) -> bool {
        *self == Counters::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForeignProcess {
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), cut at [`MAX_NAME`] bytes; empty when unreadable.
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_mib: Option<u64>,
}

/// Why a summary is refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BadTelemetry {
    #[error("wire version {0}")]
    Version(u32),
    #[error("{0} GPUs, at most {MAX_GPUS}")]
    TooManyGpus(usize),
    #[error("GPU {gpu}: {what} has {len} samples, at most {MAX_SAMPLES}")]
    TooManySamples { gpu: usize, what: &'static str, len: usize },
    #[error("GPU {gpu}: {what} of {len} entries, at most {max}")]
    TooMany { gpu: usize, what: &'static str, len: usize, max: usize },
    #[error("GPU {0}: the series are of different lengths")]
    Ragged(usize),
    #[error("{what} of {len} bytes, at most 256")]
    Name { what: &'static str, len: usize },
    #[error("interval {0} ms outside the accepted range")]
    Interval(u32),
    #[error("GPU {gpu}: a power reading of {w} W")]
    Power { gpu: usize, w: f32 },
    #[error("GPU {0}: listed twice")]
    Duplicate(usize),
}

impl Telemetry {
    /// Bounds every list and value read from the topic.
    pub fn validate(&self) -> Result<(), BadTelemetry> {
        if self.version != crate::wire::WIRE_VERSION {
            return Err(BadTelemetry::Version(self.version));
        }
        for (what, s) in
            [("node", &self.node), ("agent id", &self.agent_id), ("job id", &self.job_id), ("run id", &self.run_id)]
        {
            if !id_in_bounds(s) {
                return Err(BadTelemetry::Name { what, len: s.len() });
            }
        }
        if !INTERVAL_MS.contains(&self.interval_ms) {
            return Err(BadTelemetry::Interval(self.interval_ms));
        }
        if self.gpus.len() > MAX_GPUS {
            return Err(BadTelemetry::TooManyGpus(self.gpus.len()));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            g.validate(i)?;
            if self.gpus[..i].iter().any(|o| o.gpu == g.gpu) {
                return Err(BadTelemetry::Duplicate(i));
            }
        }
        Ok(())
    }

    /// When sample `i` was taken.
    pub fn sample_at(&self, i: usize) -> DateTime<Utc> {
        let ms = i64::from(self.interval_ms).saturating_mul(i64::try_from(i).unwrap_or(i64::MAX));
        self.from + chrono::Duration::milliseconds(ms)
    }
}

impl GpuTelemetry {
    fn validate(&self, i: usize) -> Result<(), BadTelemetry> {
        if !id_in_bounds(&self.gpu) {
            return Err(BadTelemetry::Name { what: "GPU", len: self.gpu.len() });
        }
        let n = self.sm_mhz.len();
        for (what, len) in [("sm_mhz", n), ("power_w", self.power_w.len()), ("util_pct", self.util_pct.len())] {
            if len > MAX_SAMPLES {
                return Err(BadTelemetry::TooManySamples { gpu: i, what, len });
            }
            if len != n {
                return Err(BadTelemetry::Ragged(i));
            }
        }
        if let Some(w) =
            self.power_w.iter().flatten().chain(self.power_limit_w.iter()).find(|w| !(0.0..=100_000.0).contains(*w))
        {
            return Err(BadTelemetry::Power { gpu: i, w: *w });
        }
        if self.xids.len() > MAX_XIDS {
            return Err(BadTelemetry::TooMany { gpu: i, what: "xids", len: self.xids.len(), max: MAX_XIDS });
        }
        if self.foreign.len() > MAX_FOREIGN {
            return Err(BadTelemetry::TooMany { gpu: i, what: "foreign", len: self.foreign.len(), max: MAX_FOREIGN });
        }
        if let Some(p) = self.foreign.iter().find(|p| p.name.len() > MAX_NAME) {
            return Err(BadTelemetry::Name { what: "process name", len: p.name.len() });
        }
        Ok(())
    }
}

/// Why the service suspects a node while its job runs (docs/watch.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SuspectCode {
    /// An XID of the fatal table on one of the job's GPUs.
    WatchXidFatal,
    /// A hardware slowdown, thermal or power brake, or a software thermal slowdown, while busy.
    WatchThrottled,
    /// A process that is not the job's computing on one of its GPUs.
    WatchForeignProcess,
    /// Uncorrectable ECC errors, row remaps, or PCIe or NVLink errors rising.
    WatchCountersRising,
    /// The SM clock persistently below the job's other GPUs while all are busy.
    WatchSlowClock,
    /// The power draw persistently below the job's other GPUs while all are busy.
    WatchLowPower,
    /// The enforced power limit below the job's other GPUs'.
    WatchPowerLimitLow,
}

impl SuspectCode {
    pub const ALL: [SuspectCode; 7] = [
        SuspectCode::WatchXidFatal,
        SuspectCode::WatchThrottled,
        SuspectCode::WatchForeignProcess,
        SuspectCode::WatchCountersRising,
        SuspectCode::WatchSlowClock,
        SuspectCode::WatchLowPower,
        SuspectCode::WatchPowerLimitLow,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            SuspectCode::WatchXidFatal => "WATCH_XID_FATAL",
            SuspectCode::WatchThrottled => "WATCH_THROTTLED",
            SuspectCode::WatchForeignProcess => "WATCH_FOREIGN_PROCESS",
            SuspectCode::WatchCountersRising => "WATCH_COUNTERS_RISING",
            SuspectCode::WatchSlowClock => "WATCH_SLOW_CLOCK",
            SuspectCode::WatchLowPower => "WATCH_LOW_POWER",
            SuspectCode::WatchPowerLimitLow => "WATCH_POWER_LIMIT_LOW",
        }
    }
}

impl fmt::Display for SuspectCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SuspectCode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SuspectCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown suspect code `{}`", s.escape_debug()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(n: usize) -> GpuTelemetry {
        GpuTelemetry {
            gpu: "GPU-0".into(),
            sm_mhz: vec![Some(1980); n],
            power_w: vec![Some(600.0); n],
            util_pct: vec![Some(100); n],
            ..Default::default()
        }
    }

    fn summary(gpus: Vec<GpuTelemetry>) -> Telemetry {
        Telemetry {
            version: crate::wire::WIRE_VERSION,
            node: "n0".into(),
            agent_id: "a".into(),
            job_id: "j".into(),
            run_id: "r".into(),
            from: Utc::now(),
            interval_ms: 1000,
            gpus,
        }
    }

    #[test]
    fn a_summary_within_bounds_reads_and_every_bound_is_named() {
        assert_eq!(summary(vec![gpu(5)]).validate(), Ok(()));
        assert!(matches!(summary(vec![gpu(65)]).validate(), Err(BadTelemetry::TooManySamples { .. })));
        let mut g = gpu(5);
        g.power_w.pop();
        assert_eq!(summary(vec![g]).validate(), Err(BadTelemetry::Ragged(0)));
        let mut g = gpu(5);
        g.power_w[0] = Some(f32::NAN);
        assert!(matches!(summary(vec![g]).validate(), Err(BadTelemetry::Power { .. })));
        assert_eq!(summary(vec![gpu(1), gpu(1)]).validate(), Err(BadTelemetry::Duplicate(1)));
        let many: Vec<_> = (0..65).map(|i| GpuTelemetry { gpu: format!("GPU-{i}"), ..gpu(1) }).collect();
        assert_eq!(summary(many).validate(), Err(BadTelemetry::TooManyGpus(65)));
        let mut g = gpu(1);
        g.xids = vec![79; 17];
        assert!(matches!(summary(vec![g]).validate(), Err(BadTelemetry::TooMany { what: "xids", .. })));
        let mut s = summary(vec![gpu(1)]);
        s.node = "x".repeat(257);
        assert!(matches!(s.validate(), Err(BadTelemetry::Name { what: "node", .. })));
    }

    #[test]
    fn a_watch_task_out_of_range_is_refused() {
        let t = WatchTask {
            job_id: "j".into(),
            run_id: "r".into(),
            gpu_ids: vec![],
            interval_ms: 1000,
            period_ms: 5000,
            until: Utc::now(),
        };
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(WatchTask { interval_ms: 10, ..t.clone() }.validate(), Err(BadWatch::Interval(10)));
        assert!(matches!(
            WatchTask { interval_ms: 100, period_ms: 60_000, ..t.clone() }.validate(),
            Err(BadWatch::TooManySamples { .. })
        ));
        assert_eq!(WatchTask { job_id: String::new(), ..t.clone() }.validate(), Err(BadWatch::JobId(0)));
        assert_eq!(WatchTask { run_id: "r".repeat(257), ..t.clone() }.validate(), Err(BadWatch::RunId(257)));
    }

    #[test]
    fn suspect_codes_read_back_as_written() {
        for c in SuspectCode::ALL {
            let json = serde_json::to_string(&c).expect("json");
            assert_eq!(json, format!("\"{c}\""));
            assert_eq!(c.as_str().parse::<SuspectCode>(), Ok(c));
        }
        assert!("WATCH_NOPE".parse::<SuspectCode>().is_err());
    }
}
