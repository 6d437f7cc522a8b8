//! What a GPU draws and clocks right now: one sample ([`sample_power_and_sm_clock`]), or a
//! thread sampling while a load runs ([`Sampler`]). Any check may use them to say how hard it
//! loaded the GPU: start a [`Sampler`] on the worker's GPU (its NVML index from
//! [`crate::index_of`]), run the work, [`Sampler::stop`] and report the figures.
//!
//! Power comes from two readings: `nvmlDeviceGetPowerUsage`, which on Ampere and newer GPUs is
//! an average over the last second (the highest of it is [`LoadSamples::max_power_w`], as the
//! `gpu-health` check has always judged it), and the instantaneous draw
//! (`NVML_FI_DEV_POWER_INSTANT`, newer drivers), which [`LoadSamples::power`] averages where the
//! driver has it, so that a load of a fraction of a second is not averaged with the idle second
//! before it; [`LoadSamples::power_instant`] says which one it holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_POWER_INSTANT;
use nvml_wrapper::Device;

use crate::{nvml, NvmlError};

/// One sample of a GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Power draw, watts.
    pub power_w: f64,
    /// SM clock, MHz.
    pub sm_mhz: u32,
}

/// The power draw (watts) and SM clock (MHz) of the GPU of NVML index `device_index` now.
pub fn sample_power_and_sm_clock(device_index: u32) -> Result<(f64, u32), NvmlError> {
    let d = nvml()?.device_by_index(device_index).map_err(|e| NvmlError::call("nvmlDeviceGetHandleByIndex", e))?;
    let mw = d.power_usage().map_err(|e| NvmlError::call("nvmlDeviceGetPowerUsage", e))?;
    let mhz = d.clock_info(Clock::SM).map_err(|e| NvmlError::call("nvmlDeviceGetClockInfo(SM)", e))?;
    Ok((f64::from(mw) / 1000.0, mhz))
}

/// The count, mean and highest value of one figure over the samples that read it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Running {
    pub count: u32,
    pub sum: f64,
    pub max: f64,
}

impl Running {
    /// Adds one sample; a non-finite value is not a sample.
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.max = if self.count == 0 { v } else { self.max.max(v) };
        self.count = self.count.saturating_add(1);
        self.sum += v;
    }

    /// The mean of the samples; `None` without any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
}

/// The figures sampled during a load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadSamples {
    pub samples: u32,
    /// SM clock, MHz, of every sample that read it.
    pub sm_mhz: Running,
    /// Power draw, watts: the instantaneous draw where the driver has it, else the one-second
    /// average of `nvmlDeviceGetPowerUsage` (see [`LoadSamples::power_instant`]).
    pub power: Running,
    /// Whether [`LoadSamples::power`] holds instantaneous readings (every sample of it).
    pub power_instant: bool,
    pub max_power_w: f64,
    pub max_temp_c: u32,
    /// The PCIe link's generation and width, the widest seen (a link trains down at idle).
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// The first error a sample met, if any.
    pub error: Option<String>,
}

/// A thread sampling one GPU every `period` until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<LoadSamples>>,
}

impl Sampler {
    /// Starts sampling the GPU of NVML index `device_index`.
    pub fn start(device_index: u32, period: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nvml-sampler".into())
            .spawn(move || sample_until(device_index, period, &flag))
            .ok();
        Sampler { stop, thread }
    }

    /// Stops sampling (after at most one more period) and returns the figures.
    pub fn stop(mut self) -> LoadSamples {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(s)) => s,
            Some(Err(_)) => LoadSamples { error: Some("the sampler thread panicked".into()), ..Default::default() },
            None => LoadSamples { error: Some("the sampler thread could not be started".into()), ..Default::default() },
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn sample_until(device_index: u32, period: Duration, stop: &AtomicBool) -> LoadSamples {
    let mut s = LoadSamples::default();
    let device = match nvml()
        .and_then(|n| n.device_by_index(device_index).map_err(|e| NvmlError::call("nvmlDeviceGetHandleByIndex", e)))
    {
        Ok(d) => d,
        Err(e) => {
            s.error = Some(e.to_string());
            return s;
        }
    };
    let note = |s: &mut LoadSamples, e: nvml_wrapper::error::NvmlError, what: &str| {
        if s.error.is_none() {
            s.error = Some(format!("{what}: {e}"));
        }
    };
    // The instantaneous reading is used from the first sample on if the driver has it then,
    // so that one figure never mixes the two.
    let instant = instant_power_w(&device).is_some();
    s.power_instant = instant;
    loop {
        match device.clock_info(Clock::SM) {
            Ok(mhz) => s.sm_mhz.add(f64::from(mhz)),
            Err(e) => note(&mut s, e, "SM clock"),
        }
        match device.power_usage() {
            Ok(mw) => {
                let w = f64::from(mw) / 1000.0;
                s.max_power_w = s.max_power_w.max(w);
                if !instant {
                    s.power.add(w);
                }
            }
            Err(e) => note(&mut s, e, "power"),
        }
        if let Some(w) = instant.then(|| instant_power_w(&device)).flatten() {
            s.power.add(w);
        }
        if let Ok(t) = device.temperature(TemperatureSensor::Gpu) {
            s.max_temp_c = s.max_temp_c.max(t);
        }
        if let (Ok(g), Ok(w)) = (device.current_pcie_link_gen(), device.current_pcie_link_width()) {
            if (w, g) > (s.pcie_width, s.pcie_gen) {
                (s.pcie_width, s.pcie_gen) = (w, g);
            }
        }
        s.samples = s.samples.saturating_add(1);
        if stop.load(Ordering::Relaxed) {
            return s;
        }
        std::thread::sleep(period);
    }
}

/// The instantaneous power draw, watts, where the driver has the field (milliwatts).
fn instant_power_w(device: &Device<'_>) -> Option<f64> {
    let values = device.field_values_for(&[FieldId(NVML_FI_DEV_POWER_INSTANT)]).ok()?;
    let sample = values.into_iter().next()?.ok()?;
    let mw = match sample.value.ok()? {
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
        SampleValue::F64(x) => x,
    };
    // A zero is what a driver that fills the field but does not measure it returns.
    (mw > 0.0).then_some(mw / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_mean_and_max() {
        let mut r = Running::default();
        assert_eq!(r.mean(), None);
        for v in [300.0, 500.0, f64::NAN, 400.0] {
            r.add(v);
        }
        assert_eq!((r.count, r.max), (3, 500.0));
        assert_eq!(r.mean(), Some(400.0));
        let mut neg = Running::default();
        neg.add(-2.0);
        assert_eq!((neg.max, neg.mean()), (-2.0, Some(-2.0)));
    }
}
