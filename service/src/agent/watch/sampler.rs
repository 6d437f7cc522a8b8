//! The sampling thread of one watched job: samples every interval on multiples of it in
//! wall-clock time (so that every node of the job samples at the same instants), reading the SM
//! clock and the power also every [`SUB_SAMPLE_MS`] between them for the interval's means, and at the end of
//! each period, also on multiples of it, sends one [`Telemetry`] for the node. It stops when
//! told, or when its lease (`until`) runs out.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use gpusanity_common::health::ClockEvents;
use gpusanity_common::wire::watch::{Counters, GpuTelemetry, Telemetry, Throttle};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_nvml::watch::Instant;
use tokio::sync::mpsc;

use super::source::{PeriodOf, Source};

/// How often the SM clock and the power are read between two samples.
pub(crate) const SUB_SAMPLE_MS: i64 = 100;

/// What the thread needs of the watch.
pub(crate) struct Plan {
    pub job_id: String,
    pub run_id: String,
    pub node: String,
    pub agent_id: String,
    pub interval_ms: u32,
    pub period_ms: u32,
}

/// How the agent stops the thread or extends its lease.
#[derive(Clone, Default)]
pub(crate) struct Control {
    pub stop: Arc<AtomicBool>,
    /// Milliseconds since the epoch.
    pub until_ms: Arc<AtomicI64>,
}

impl Control {
    fn ended(&self, now_ms: i64) -> bool {
        self.stop.load(Ordering::Relaxed) || now_ms > self.until_ms.load(Ordering::Relaxed)
    }
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Sleeps until `at_ms`, waking every 100 ms to see whether the watch ended; false if it did.
fn sleep_until(at_ms: i64, control: &Control) -> bool {
    loop {
        let now = now_ms();
        if control.ended(now) {
            return false;
        }
        if now >= at_ms {
            return true;
        }
        std::thread::sleep(Duration::from_millis(u64::try_from((at_ms - now).min(100)).unwrap_or(100)));
    }
}

/// Samples until the watch ends, sending each period's summary on `tx`.
pub(crate) fn run(plan: Plan, mut source: Box<dyn Source>, control: Control, tx: mpsc::UnboundedSender<Telemetry>) {
    let interval = i64::from(plan.interval_ms);
    let period = i64::from(plan.period_ms);
    let per_period = u64::try_from(period / interval).unwrap_or(1).max(1);
    let gpus = source.gpus();
    let mut from = (now_ms() / period + 1) * period;
    let mut k: u64 = 0;
    loop {
        let mut series: Vec<GpuTelemetry> =
            gpus.iter().map(|g| GpuTelemetry { gpu: g.clone(), ..Default::default() }).collect();
        for i in 0..per_period {
            let at = from + interval * i64::try_from(i).unwrap_or(0);
            if !sub_samples(at - interval, at, source.as_mut(), &control) || !sleep_until(at, &control) {
                return;
            }
            for (s, r) in series.iter_mut().zip(source.instant(k)) {
                add_sample(s, &r);
            }
            k += 1;
        }
        for (s, p) in series.iter_mut().zip(source.period(k.saturating_sub(1))) {
            add_period(s, p);
        }
        let t = Telemetry {
            version: WIRE_VERSION,
            node: plan.node.clone(),
            agent_id: plan.agent_id.clone(),
            job_id: plan.job_id.clone(),
            run_id: plan.run_id.clone(),
            from: Utc.timestamp_millis_opt(from).single().unwrap_or_else(Utc::now),
            interval_ms: plan.interval_ms,
            gpus: series,
        };
        if tx.send(t).is_err() {
            return;
        }
        from += period;
        // A stall longer than a period (a suspended process) skips the periods it missed.
        let now = now_ms();
        if now >= from + period {
            from = (now / period + 1) * period;
        }
    }
}

/// Reads the clock and the power every [`SUB_SAMPLE_MS`] strictly between `from` and `to` (skipping the
/// instants already past: a late thread does not read in a burst); false if the watch ended.
fn sub_samples(from: i64, to: i64, source: &mut dyn Source, control: &Control) -> bool {
    let mut at = from + SUB_SAMPLE_MS;
    while at < to {
        if now_ms() <= at {
            if !sleep_until(at, control) {
                return false;
            }
            source.sub_sample();
        }
        at += SUB_SAMPLE_MS;
    }
    true
}

fn add_sample(s: &mut GpuTelemetry, r: &Instant) {
    s.sm_mhz.push(r.sm_mhz);
    s.power_w.push(r.power_w);
    s.util_pct.push(r.util_pct);
    if let Some(bits) = r.reasons {
        count_reasons(&mut s.throttle, bits);
    }
}

fn count_reasons(t: &mut Throttle, bits: u64) {
    let on = |b: u64| u32::from(bits & b != 0);
    t.hw_slowdown += on(ClockEvents::HW_SLOWDOWN);
    t.hw_thermal += on(ClockEvents::HW_THERMAL);
    t.hw_power_brake += on(ClockEvents::HW_POWER_BRAKE);
    t.sw_thermal += on(ClockEvents::SW_THERMAL);
    t.sw_power_cap += on(ClockEvents::SW_POWER_CAP);
}

fn add_period(s: &mut GpuTelemetry, p: PeriodOf) {
    let q = p.period;
    s.power_limit_w = q.power_limit_w;
    s.temp_max_c = q.temp_c;
    s.mem_used_mib = q.mem_used_mib;
    s.counters = Counters {
        ecc_uncorrected: q.ecc_uncorrected,
        remapped_uncorrectable: q.remapped_uncorrectable,
        pcie_replay: q.pcie_replay,
        nvlink_errors: q.nvlink_errors,
    };
    s.xids = q.xids;
    s.foreign = p.foreign;
}
