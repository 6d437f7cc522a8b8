//! `gpu-health`: the GPU's own health as NVML reports it (docs/health.md). Per rank, the GPU
//! it drives (found in NVML by its PCI bus id, so CUDA's ordering and `CUDA_VISIBLE_DEVICES`
//! do not matter):
//!
//! - the reader ([`Monitor`]) is started when the worker starts, before its first check, when
//!   this check is selected: its XID event set and counter baselines cover every check of the
//!   run up to this one, which runs after them all. Run on its own, the window is the check.
//! - a sampler thread reads the SM clock, power, temperature and PCIe link under load: the
//!   clock "under load" is the highest SM clock sampled. The load is the `gemm` check's warm-up
//!   and timed products when that check ran earlier in this worker ([`EarlierLoad`]), else a
//!   short load of this check's own (a GEMM through the backend, `gpu-health.load-ms`).
//! - then everything is read into [`Readings`], written whole into the rank's notes
//!   (`readings`, JSON); the diagnosis decides on them ([`gpusanity_common::health`]).
//!
//! On the CPU backend it is not applicable. On a CUDA node where NVML cannot be loaded the
//! rank notes why (`nvml_unavailable`) and the diagnosis warns: health unknown.
//!
//! [`Readings`]: gpusanity_common::health::Readings

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cudarc::driver::sys::CUdevice_attribute;
use gpusanity_common::config::health::GpuHealthConfig;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckDetail, CheckStatus, RankResult};
use gpusanity_cuda::CudaDevice;
use gpusanity_nvml::{LoadSamples, Monitor, NvmlError, Sampler};

use super::CheckCtx;
use crate::backend::DeviceBackend;

pub const NAME: CheckId = CheckId::GpuHealth;

/// The reader of a worker's GPU, started when the worker starts if `checks` has this check
/// and the backend drives a GPU; `None` otherwise.
pub fn watch(backend: &dyn DeviceBackend, checks: &[CheckId]) -> Option<Result<Monitor, NvmlError>> {
    if !checks.contains(&NAME) {
        return None;
    }
    let dev = backend.cuda_device()?;
    Some(start(&dev, "worker start"))
}

/// How the worker's GPU is linked to the node's others, as NVML reads it: NVLink when one of
/// its links is up, PCIe when none is; `None` on CPU, on a node of one GPU (nothing to link
/// to), or where NVML cannot tell.
pub fn link(backend: &dyn DeviceBackend, local_gpus: usize) -> Option<gpusanity_common::report::Link> {
    use gpusanity_common::report::Link;
    if local_gpus < 2 {
        return None;
    }
    let dev = backend.cuda_device()?;
    let up = gpusanity_nvml::active_nvlinks(&pci_bus_id(&dev).ok()?).ok()?;
    Some(if up > 0 { Link::Nvlink } else { Link::Pcie })
}

/// The PCI bus id of a CUDA device, as NVML takes it (`DDDDDDDD:BB:DD.0`).
pub(crate) fn pci_bus_id(dev: &CudaDevice) -> Result<String, NvmlError> {
    let ctx = dev.context();
    let attr = |a| {
        ctx.attribute(a)
            .map_err(|e| NvmlError::Call { what: "cuDeviceGetAttribute(PCI)".into(), err: format!("{e:?}") })
    };
    let domain = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let device = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok(format!("{domain:08x}:{bus:02x}:{device:02x}.0"))
}

fn start(dev: &CudaDevice, window_from: &str) -> Result<Monitor, NvmlError> {
    Monitor::start(&pci_bus_id(dev)?, window_from)
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let rank = ctx.place.rank;
    let Some(dev) = ctx.backend.cuda_device() else {
        return Ok(super::not_applicable(
            rank,
            "CPU backend: no GPU whose health NVML could report (checked on CUDA workers only)".into(),
        ));
    };
    let own;
    let monitor = match ctx.health {
        Some(Ok(m)) => m,
        Some(Err(e)) => return Ok(unavailable(rank, e)),
        None => {
            own = start(&dev, "check start");
            match &own {
                Ok(m) => m,
                Err(e) => return Ok(unavailable(rank, e)),
            }
        }
    };
    let cfg = &ctx.configs.gpu_health;
    ctx.progress.phase(NAME, "load", 0);
    let (samples, load) = match ctx.load.take().filter(EarlierLoad::enough) {
        Some(earlier) => (earlier.samples, Ok(earlier.what)),
        None => {
            let sampler = Sampler::start(monitor.index(), Duration::from_millis(cfg.sample_ms));
            let load = run_load(ctx.backend, cfg);
            (sampler.stop(), load)
        }
    };
    ctx.progress.phase(NAME, "read", 1);
    let readings = monitor.read(&samples);
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.notes.insert("window".into(), format!("{:.2} s from the {}", readings.window_s, readings.window_from));
    if let Some(c) = readings.sm_clock.value() {
        r.metrics.insert("sm_clock_load_mhz".into(), f64::from(c.under_load_mhz));
        r.metrics.insert("sm_clock_max_mhz".into(), f64::from(c.max_mhz));
    }
    if let Some(p) = readings.power.value() {
        r.metrics.insert("power_load_w".into(), p.under_load_w);
        r.metrics.insert("power_limit_w".into(), p.enforced_limit_w);
    }
    if let Some(t) = readings.temperature.value() {
        r.metrics.insert("temperature_c".into(), f64::from(t.gpu_c));
    }
    if let Some(x) = readings.xids.value() {
        r.metrics.insert("xids".into(), x.len() as f64);
    }
    r.metrics.insert("visible_gpus".into(), f64::from(readings.visible_gpus));
    if let Some(ps) = readings.processes.value() {
        // Every process on the GPU, this worker's own among them, on every run.
        r.metrics.insert("gpu_processes".into(), ps.len() as f64);
        let list: Vec<String> = ps
            .iter()
            .map(|p| {
                let mem = p.used_mib.map_or("? MiB".to_string(), |m| format!("{m} MiB"));
                format!("{} {} {} {mem}", p.pid, p.name.as_deref().unwrap_or("?"), p.kind)
            })
            .collect();
        r.notes.insert("processes".into(), if list.is_empty() { "none".into() } else { list.join("; ") });
    }
    match load {
        Ok(text) => {
            r.notes.insert("load".into(), text);
        }
        Err(e) => {
            // The readings are kept: an XID or a fallen-off GPU is what explains a failed load.
            r.status = CheckStatus::Error;
            r.error = Some(format!("{e:#}"));
        }
    }
    r.detail = Some(CheckDetail::GpuHealth { readings: Box::new(readings) });
    Ok(r)
}

/// The GPU's figures sampled while an earlier check of this worker loaded it, and what that
/// load was. `gpu-health` reads them instead of running its own load (which costs about 0.4 s on
/// an H200) when they cover at least [`EarlierLoad::MIN_WINDOW`] and
/// [`EarlierLoad::MIN_SAMPLES`] readings without a sampling error.
pub struct EarlierLoad {
    samples: LoadSamples,
    what: String,
    window: Duration,
}

impl EarlierLoad {
    /// The shortest earlier load read in place of the check's own (`gemm`'s 100 products of
    /// side 8192 last about 160 ms on an H200).
    pub const MIN_WINDOW: Duration = Duration::from_millis(100);
    pub const MIN_SAMPLES: u32 = 5;

    fn enough(&self) -> bool {
        self.window >= Self::MIN_WINDOW && self.samples.samples >= Self::MIN_SAMPLES && self.samples.error.is_none()
    }
}

/// A sampler started by a check that loads the GPU (`gemm`), when `gpu-health` runs later in
/// this worker with its reader started; `None` otherwise.
pub fn sample_load(ctx: &CheckCtx<'_>) -> Option<LoadSampling> {
    let Some(Ok(monitor)) = ctx.health else {
        return None;
    };
    let period = Duration::from_millis(ctx.configs.gpu_health.sample_ms);
    Some(LoadSampling { sampler: Sampler::start(monitor.index(), period), started: Instant::now() })
}

/// A load being sampled for `gpu-health` ([`sample_load`]).
pub struct LoadSampling {
    sampler: Sampler,
    started: Instant,
}

impl LoadSampling {
    /// Stops sampling; `what` says what the load was (in the check's `load` note).
    pub fn stop(self, what: String) -> EarlierLoad {
        let window = self.started.elapsed();
        let samples = self.sampler.stop();
        let what = format!("{what} over {:.0} ms, sampled by an earlier check", window.as_secs_f64() * 1e3);
        EarlierLoad { samples, what, window }
    }
}

fn unavailable(rank: usize, e: &NvmlError) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.detail = Some(CheckDetail::NvmlUnavailable { why: e.to_string() });
    r
}

/// The load the clocks are sampled under: square GEMMs of side `load_size` for `load_ms`, on
/// inputs exact in bf16 (multiples of 1/8 up to 1), not verified (the `gemm` check verifies
/// products). Returns what ran.
fn run_load(backend: &mut dyn DeviceBackend, cfg: &GpuHealthConfig) -> Result<String> {
    let n = cfg.load_size;
    let elems = n.checked_mul(n).context("load size overflows")?;
    let a: Vec<f32> = (0..elems).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let b: Vec<f32> = (0..elems).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect();
    backend.gemm_load(n, &a, &b).context("loading the load's GEMM")?;
    let budget = Duration::from_millis(cfg.load_ms);
    let start = Instant::now();
    let mut products: u64 = 0;
    let mut device_s = 0.0;
    let outcome = loop {
        match backend.gemm_run(10) {
            Ok(times) => {
                products = products.saturating_add(times.len() as u64);
                device_s += times.iter().sum::<f64>();
            }
            Err(e) => break Err(anyhow::Error::from(e).context("the load's GEMM")),
        }
        if start.elapsed() >= budget {
            break Ok(());
        }
    };
    backend.gemm_free();
    outcome?;
    Ok(format!(
        "{products} GEMMs {n}x{n}x{n} over {:.0} ms ({:.0} ms on the device)",
        start.elapsed().as_secs_f64() * 1e3,
        device_s * 1e3
    ))
}
