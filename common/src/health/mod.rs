//! The `gpu-health` check's data and decisions, apart from any reading: what NVML returned for
//! one GPU ([`Readings`], serde, so recorded readings are test fixtures), which XIDs are fatal
//! ([`xid`]), and the pure decisions from readings to findings ([`decide`], [`census`]).
//! Reading NVML is the `gpusanity-nvml` crate's; placing findings on ranks is the diagnosis's.

mod decide;
pub mod readiness;
#[cfg(test)]
mod readiness_tests;
#[cfg(test)]
mod tests;
pub mod xid;

use serde::{Deserialize, Serialize};

pub use decide::{census, decide, nvml_unavailable, Policy};
pub use readiness::{GpuProcess, GpuSettings, Mps, Readiness};

/// One reading: its value, "not supported" by this device or driver (not an error: recorded as
/// such, decided on as absent), or the error NVML returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Read<T> {
    Value(T),
    NotSupported,
    Error(String),
}

impl<T> Read<T> {
    /// The value, if there is one.
    pub fn value(&self) -> Option<&T> {
        match self {
            Read::Value(v) => Some(v),
            Read::NotSupported | Read::Error(_) => None,
        }
    }
}

/// ECC mode and uncorrectable (double-bit) error counts: volatile since the driver loaded,
/// aggregate over the device's life.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ecc {
    pub enabled: bool,
    pub volatile_uncorrected: u64,
    pub aggregate_uncorrected: u64,
    #[serde(default)]
    pub volatile_corrected: u64,
    #[serde(default)]
    pub aggregate_corrected: u64,
}

/// Row remapping (A100 and later): rows remapped for correctable and uncorrectable errors, a
/// remap waiting for a GPU reset, and a remap that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// The remapped-rows histogram: how many memory banks have all, many, some, few or no spare
/// rows left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BankHistogram {
    pub max: u32,
    pub high: u32,
    pub partial: u32,
    pub low: u32,
    pub none: u32,
}

/// Dynamic page retirement (before row remapping): pages retired for multiple single-bit
/// errors and for double-bit errors, and a retirement waiting for a reset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    pub single_bit: u32,
    pub double_bit: u32,
    pub pending: bool,
}

/// One XID event read from the event set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    pub xid: u64,
}

/// The clock-event (throttle) reasons active at the end of the load, by NVML's bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockEvents {
    /// `nvmlClocksEventReason*` bits, as NVML returned them.
    pub mask: u64,
}

impl ClockEvents {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL: u64 = 0x20;
    pub const HW_THERMAL: u64 = 0x40;
    pub const HW_POWER_BRAKE: u64 = 0x80;
    pub const DISPLAY_CLOCKS: u64 = 0x100;

    /// The names of the active reasons.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (Self::GPU_IDLE, "gpu_idle"),
            (Self::APPLICATIONS_CLOCKS, "applications_clocks"),
            (Self::SW_POWER_CAP, "sw_power_cap"),
            (Self::HW_SLOWDOWN, "hw_slowdown"),
            (Self::SYNC_BOOST, "sync_boost"),
            (Self::SW_THERMAL, "sw_thermal"),
            (Self::HW_THERMAL, "hw_thermal"),
            (Self::HW_POWER_BRAKE, "hw_power_brake"),
            (Self::DISPLAY_CLOCKS, "display_clocks"),
        ]
        .into_iter()
        .filter(|(bit, _)| self.mask & bit != 0)
        .map(|(_, name)| name)
        .collect()
    }
}

/// Time spent in each clock event over the window, nanoseconds (NVML's clock-event counters,
/// field values of newer drivers; absent ones are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockEventTime {
    pub sw_power_cap_ns: Option<u64>,
    pub sw_thermal_ns: Option<u64>,
    pub hw_thermal_ns: Option<u64>,
    pub hw_power_brake_ns: Option<u64>,
}

/// The SM clock while the check's load ran, against the device's maximum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmClock {
    /// The highest SM clock sampled during the load.
    pub under_load_mhz: u32,
    pub max_mhz: u32,
    /// Samples taken during the load.
    pub samples: u32,
}

/// Temperature and its thresholds, degrees Celsius.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Temperature {
    /// The highest GPU temperature sampled (during the load, and at the end).
    pub gpu_c: u32,
    pub slowdown_c: Option<u32>,
    pub shutdown_c: Option<u32>,
}

/// Power draw and its limits, watts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Power {
    /// The highest draw sampled during the load.
    pub under_load_w: f64,
    pub enforced_limit_w: f64,
    pub default_limit_w: Option<f64>,
}

/// The PCIe link: generation and width now (read during the load) against the maximum, and the
/// replay counter's increase over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pcie {
    pub gen: u32,
    pub max_gen: u32,
    pub width: u32,
    pub max_width: u32,
    pub replay_delta: Option<u64>,
}

/// One NVLink: whether it is up, and its error counters' increase over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    pub link: u32,
    pub active: bool,
    pub crc_flit_delta: Option<u64>,
    pub crc_data_delta: Option<u64>,
    pub replay_delta: Option<u64>,
    pub recovery_delta: Option<u64>,
}

/// What NVML returned for one GPU over one window (from when the reader started to the end of
/// the check), as the check records it in its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Readings {
    /// NVML's index of the GPU (PCI order; not the CUDA ordinal).
    pub index: u32,
    pub pci_bus_id: String,
    pub name: String,
    #[serde(default)]
    pub memory_total_mib: Option<u64>,
    #[serde(default)]
    pub driver_version: Option<String>,
    /// GPUs NVML sees on the node (the census).
    pub visible_gpus: u32,
    /// Seconds from the start of the window to the reading.
    pub window_s: f64,
    /// Where the window started ("worker start" or "check start").
    #[serde(default)]
    pub window_from: String,
    pub ecc: Read<Ecc>,
    pub remapped_rows: Read<RemappedRows>,
    pub bank_histogram: Read<BankHistogram>,
    pub retired_pages: Read<RetiredPages>,
    /// The XID events of the window: `NotSupported` where the event set could not be opened.
    pub xids: Read<Vec<XidEvent>>,
    pub clock_events: Read<ClockEvents>,
    #[serde(default)]
    pub clock_event_time: ClockEventTime,
    pub sm_clock: Read<SmClock>,
    pub temperature: Read<Temperature>,
    pub power: Read<Power>,
    pub pcie: Read<Pcie>,
    /// Every NVLink the device has (an empty list: none).
    pub nvlink: Read<Vec<NvLink>>,
    /// The driver's recommended recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`):
    /// 0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset.
    pub recovery_action: Read<u64>,
    /// The processes NVML lists on the GPU (running compute and graphics), the check's own
    /// workers among them.
    #[serde(default = "not_read")]
    pub processes: Read<Vec<GpuProcess>>,
    /// Compute mode, MIG, pending ECC, application clocks, persistence.
    #[serde(default)]
    pub settings: GpuSettings,
}

/// A reading absent from older records.
fn not_read<T>() -> Read<T> {
    Read::NotSupported
}
