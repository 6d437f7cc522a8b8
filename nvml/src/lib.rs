//! GPU health readings through NVML, the driver's management library, loaded at run time.
//!
//! Nothing of NVML is linked at build time: `nvml-wrapper` opens `libnvidia-ml.so.1` (the
//! driver's, in its lib64; `libnvidia-ml.so` as a fallback) with libloading when [`nvml`] is
//! first called, and looks every symbol up on its own, so a symbol an older driver lacks is an
//! error of that one reading, not a failed start. The library stays loaded and initialised
//! for the life of the process (one worker), which is what lets an XID event set opened at the
//! worker's start be read at the end of its run.
//!
//! - [`Monitor`]: the `gpu-health` check's reader of one GPU: started with a baseline of its
//!   counters and an XID event set, read into a [`Readings`] with the counters' increases.
//! - [`Sampler`] and [`sample_power_and_sm_clock`]: what a GPU draws and clocks right now, for
//!   any check that wants to say how hard it loaded the GPU.
//!
//! [`Readings`]: gpusanity_common::health::Readings

mod interval;
mod monitor;
mod raw;
mod read;
mod readiness;
mod sample;
pub mod watch;
mod xid_events;

use std::ffi::OsStr;
use std::sync::OnceLock;

use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::Nvml;
use thiserror::Error;

pub use monitor::Monitor;
pub use sample::{sample_power_and_sm_clock, LoadSamples, Running, Sample, Sampler};

/// The library's file names, in the order tried: the driver's soname first (always there
/// with a driver), then the development symlink.
const LIB_NAMES: &[&str] = &["libnvidia-ml.so.1", "libnvidia-ml.so"];

#[derive(Debug, Clone, Error)]
pub enum NvmlError {
    /// NVML could not be loaded or initialised (no driver, no library in the library path).
    #[error("NVML unavailable: {0}")]
    Unavailable(String),
    /// A call failed: `what` names it.
    #[error("{what}: {err}")]
    Call { what: String, err: String },
}

impl NvmlError {
    pub(crate) fn call(what: &str, err: WrapperError) -> NvmlError {
        NvmlError::Call { what: what.into(), err: err.to_string() }
    }
}

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

fn open() -> Result<Nvml, String> {
    let mut errors = Vec::new();
    for name in LIB_NAMES {
        match Nvml::builder().lib_path(OsStr::new(name)).init() {
            Ok(n) => return Ok(n),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    Err(errors.join("; "))
}

/// NVML, loaded and initialised once for the process; the same error on every call when it
/// cannot be.
pub fn nvml() -> Result<&'static Nvml, NvmlError> {
    NVML.get_or_init(open).as_ref().map_err(|e| NvmlError::Unavailable(e.clone()))
}

/// Whether NVML can be loaded here.
pub fn available() -> bool {
    nvml().is_ok()
}

/// The GPUs NVML sees on this node (all of them: NVML ignores `CUDA_VISIBLE_DEVICES`).
pub fn device_count() -> Result<u32, NvmlError> {
    nvml()?.device_count().map_err(|e| NvmlError::call("nvmlDeviceGetCount", e))
}

/// NVML's index of the GPU at `pci_bus_id` (as CUDA gives it, `DDDDDDDD:BB:DD.F`).
pub fn index_of(pci_bus_id: &str) -> Result<u32, NvmlError> {
    let n = nvml()?;
    let d = n
        .device_by_pci_bus_id(pci_bus_id)
        .map_err(|e| NvmlError::call(&format!("nvmlDeviceGetHandleByPciBusId({pci_bus_id})"), e))?;
    d.index().map_err(|e| NvmlError::call("nvmlDeviceGetIndex", e))
}

/// How many NVLinks of the GPU at `pci_bus_id` are up (0: none, or a GPU without NVLink).
pub fn active_nvlinks(pci_bus_id: &str) -> Result<u32, NvmlError> {
    let n = nvml()?;
    let d = n
        .device_by_pci_bus_id(pci_bus_id)
        .map_err(|e| NvmlError::call(&format!("nvmlDeviceGetHandleByPciBusId({pci_bus_id})"), e))?;
    let mut up = 0;
    for l in 0..monitor::MAX_LINKS {
        match d.link_wrapper_for(l).is_active() {
            Ok(true) => up += 1,
            Ok(false) => {}
            // Past the device's last link, or no NVLink at all.
            Err(_) => break,
        }
    }
    Ok(up)
}
