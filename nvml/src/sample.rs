//! What a GPU draws and clocks right now: one sample ([`sample_power_and_sm_clock`]), or a
//! thread sampling while a load runs ([`Sampler`]). Any check may use them to say how hard it
//! loaded the GPU: start a [`Sampler`] on the worker's GPU (its NVML index from
//! [`crate::index_of`]), run the work, [`Sampler::stop`] and report the figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};

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

/// The highest figures sampled during a load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadSamples {
    pub samples: u32,
    pub max_sm_mhz: u32,
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
    loop {
        match device.clock_info(Clock::SM) {
            Ok(mhz) => s.max_sm_mhz = s.max_sm_mhz.max(mhz),
            Err(e) => note(&mut s, e, "SM clock"),
        }
        match device.power_usage() {
            Ok(mw) => s.max_power_w = s.max_power_w.max(f64::from(mw) / 1000.0),
            Err(e) => note(&mut s, e, "power"),
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
