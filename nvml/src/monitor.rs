//! The `gpu-health` reader of one GPU: [`Monitor::start`] opens an XID event set and takes a
//! baseline of the GPU's counters; [`Monitor::read`] reads everything into [`Readings`], the
//! counters as their increase since the start. A reading the device or driver does not have is
//! `not_supported`, never an error of the whole read.

use std::cell::RefCell;
use std::time::Instant;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id;
use nvml_wrapper::{Device, EventSet, Nvml};
use tracing::debug;

use gpusanity_common::health::{
    ClockEventTime, ClockEvents, Ecc, NvLink, Pcie, Power, Read, Readings, RetiredPages, SmClock, Temperature, XidEvent,
};

use crate::read::read;
use crate::sample::LoadSamples;
use crate::{nvml, raw, NvmlError};

/// The most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
pub(crate) const MAX_LINKS: u32 = 18;
/// The most XID events kept from one window (a storm of one XID says no more than this).
const MAX_EVENTS: usize = 1000;

/// A link's error counters: CRC flit, CRC data, replay, recovery.
pub(crate) const NVLINK_ERRORS: [ErrorCounter; 4] =
    [ErrorCounter::DlCrcFlit, ErrorCounter::DlCrcData, ErrorCounter::DlReplay, ErrorCounter::DlRecovery];

/// The clock-event counters, as field values (newer drivers; nanoseconds).
const CLOCK_FIELDS: [u32; 4] = [
    field_id::NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    field_id::NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    field_id::NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    field_id::NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
];

/// Counters whose increase over the window is judged.
#[derive(Debug, Clone, Default)]
struct Counters {
    pcie_replay: Option<u64>,
    /// Per link: CRC flit, CRC data, replay, recovery.
    nvlink: Vec<(u32, bool, [Option<u64>; 4])>,
    clock_ns: [Option<u64>; 4],
}

/// One GPU watched from [`Monitor::start`] on.
pub struct Monitor {
    nvml: &'static Nvml,
    device: Device<'static>,
    index: u32,
    pci_bus_id: String,
    started: Instant,
    /// The window's start as NVML's process samples time it (microseconds since the epoch).
    started_us: u64,
    window_from: String,
    events: Result<EventSet<'static>, String>,
    seen: RefCell<Vec<XidEvent>>,
    baseline: Counters,
}

fn as_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(x) => Some(u64::from(x)),
        SampleValue::U64(x) => Some(x),
        SampleValue::I64(x) => u64::try_from(x).ok(),
        SampleValue::F64(_) => None,
    }
}

/// Field values by id, `None` for each the driver does not have.
fn fields(device: &Device<'_>, ids: &[u32]) -> Vec<Option<u64>> {
    let wanted: Vec<FieldId> = ids.iter().map(|i| FieldId(*i)).collect();
    match device.field_values_for(&wanted) {
        Ok(values) => values
            .into_iter()
            .map(|s| s.ok().and_then(|s| s.value.ok()).as_ref().and_then(as_u64))
            .chain(std::iter::repeat(None))
            .take(ids.len())
            .collect(),
        Err(e) => {
            debug!("field values {ids:?}: {e}");
            vec![None; ids.len()]
        }
    }
}

pub(crate) fn delta(now: Option<u64>, then: Option<u64>) -> Option<u64> {
    Some(now?.saturating_sub(then?))
}

impl Monitor {
    /// Starts watching the GPU at `pci_bus_id` (as CUDA names it); `window_from` says where in
    /// the run that is ("worker start", "check start"), for the report.
    pub fn start(pci_bus_id: &str, window_from: &str) -> Result<Monitor, NvmlError> {
        let nvml = nvml()?;
        let device = nvml
            .device_by_pci_bus_id(pci_bus_id)
            .map_err(|e| NvmlError::call(&format!("nvmlDeviceGetHandleByPciBusId({pci_bus_id})"), e))?;
        let index = device.index().map_err(|e| NvmlError::call("nvmlDeviceGetIndex", e))?;
        let events = crate::xid_events::open(nvml, &device).map_err(|e| e.to_string());
        let mut m = Monitor {
            nvml,
            device,
            index,
            pci_bus_id: pci_bus_id.to_string(),
            started: Instant::now(),
            started_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            window_from: window_from.to_string(),
            events,
            seen: RefCell::new(Vec::new()),
            baseline: Counters::default(),
        };
        m.baseline = m.counters();
        Ok(m)
    }

    /// NVML's index of the GPU (for a [`crate::Sampler`]).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The driver's version (`580.95.05`), as [`Monitor::read`] reports it; None when NVML
    /// cannot say.
    pub fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn counters(&self) -> Counters {
        let d = &self.device;
        let mut nvlink = Vec::new();
        for l in 0..MAX_LINKS {
            let link = d.link_wrapper_for(l);
            let active = match link.is_active() {
                Ok(a) => a,
                // Past the device's last link, or no NVLink at all.
                Err(_) => break,
            };
            nvlink.push((l, active, NVLINK_ERRORS.map(|k| link.error_counter(k).ok())));
        }
        let clock = fields(d, &CLOCK_FIELDS);
        Counters {
            pcie_replay: d.pcie_replay_counter().ok().map(u64::from),
            nvlink,
            clock_ns: [clock[0], clock[1], clock[2], clock[3]],
        }
    }

    fn xids(&self) -> Read<Vec<XidEvent>> {
        let set = match &self.events {
            Ok(set) => set,
            Err(e) if e.contains("not supported") || e.contains("NotSupported") => return Read::NotSupported,
            Err(e) => return Read::Error(format!("the XID event set could not be opened: {e}")),
        };
        let mut seen = self.seen.borrow_mut();
        let mut new = Vec::new();
        let drained = crate::xid_events::drain(set, &mut new, MAX_EVENTS.saturating_sub(seen.len()));
        seen.extend(new.into_iter().map(|xid| XidEvent { xid }));
        if let Err(e) = drained {
            return Read::Error(format!("reading XID events: {e}"));
        }
        Read::Value(seen.clone())
    }

    /// Everything NVML says about the GPU now, with `load` the figures sampled while the
    /// check's load ran.
    pub fn read(&self, load: &LoadSamples) -> Readings {
        let d = &self.device;
        let now = self.counters();
        let base = &self.baseline;
        let ecc = read(d.is_ecc_enabled().map(|mode| {
            let count = |t, c| d.total_ecc_errors(t, c).unwrap_or(0);
            Ecc {
                enabled: mode.currently_enabled,
                volatile_uncorrected: count(MemoryError::Uncorrected, EccCounter::Volatile),
                aggregate_uncorrected: count(MemoryError::Uncorrected, EccCounter::Aggregate),
                volatile_corrected: count(MemoryError::Corrected, EccCounter::Volatile),
                aggregate_corrected: count(MemoryError::Corrected, EccCounter::Aggregate),
            }
        }));
        let retired_pages = match read(d.are_pages_pending_retired()) {
            Read::Value(pending) => Read::Value(RetiredPages {
                single_bit: pages(d, RetirementCause::MultipleSingleBitEccErrors),
                double_bit: pages(d, RetirementCause::DoubleBitEccError),
                pending,
            }),
            Read::NotSupported => Read::NotSupported,
            Read::Error(e) => Read::Error(e),
        };
        let temperature = read(d.temperature(TemperatureSensor::Gpu).map(|t| Temperature {
            gpu_c: t.max(load.max_temp_c),
            slowdown_c: d.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
            shutdown_c: d.temperature_threshold(TemperatureThreshold::Shutdown).ok(),
        }));
        let power = read(d.enforced_power_limit().map(|mw| Power {
            under_load_w: load.max_power_w,
            enforced_limit_w: f64::from(mw) / 1000.0,
            default_limit_w: d.power_management_limit_default().ok().map(|mw| f64::from(mw) / 1000.0),
        }));
        let pcie = match (d.max_pcie_link_gen(), d.max_pcie_link_width()) {
            (Ok(max_gen), Ok(max_width)) => {
                let (gen, width) = if load.pcie_width > 0 {
                    (load.pcie_gen, load.pcie_width)
                } else {
                    (d.current_pcie_link_gen().unwrap_or(0), d.current_pcie_link_width().unwrap_or(0))
                };
                Read::Value(Pcie {
                    gen,
                    max_gen,
                    width,
                    max_width,
                    replay_delta: delta(now.pcie_replay, base.pcie_replay),
                })
            }
            (Err(e), _) | (_, Err(e)) => read::<Pcie>(Err(e)),
        };
        let sm_clock = match (d.max_clock_info(Clock::SM), &load.error) {
            (Ok(max_mhz), None) if load.samples > 0 => {
                Read::Value(SmClock { under_load_mhz: load.sm_mhz.max as u32, max_mhz, samples: load.samples })
            }
            (Ok(_), Some(e)) => Read::Error(format!("sampling under load: {e}")),
            (Ok(_), None) => Read::Error("no sample taken under load".into()),
            (Err(e), _) => read(Err(e)),
        };
        let nvlink = Read::Value(
            now.nvlink
                .iter()
                .map(|(l, active, c)| {
                    let b = base.nvlink.iter().find(|(bl, _, _)| bl == l).map(|(_, _, b)| *b).unwrap_or_default();
                    NvLink {
                        link: *l,
                        active: *active,
                        crc_flit_delta: delta(c[0], b[0]),
                        crc_data_delta: delta(c[1], b[1]),
                        replay_delta: delta(c[2], b[2]),
                        recovery_delta: delta(c[3], b[3]),
                    }
                })
                .collect(),
        );
        let recovery = fields(d, &[field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]);
        let clock = |i: usize| delta(now.clock_ns[i], base.clock_ns[i]);
        Readings {
            index: self.index,
            pci_bus_id: self.pci_bus_id.clone(),
            name: d.name().unwrap_or_default(),
            memory_total_mib: d.memory_info().ok().map(|m| m.total >> 20),
            driver_version: self.driver_version(),
            visible_gpus: self.nvml.device_count().unwrap_or(0),
            window_s: self.started.elapsed().as_secs_f64(),
            window_from: self.window_from.clone(),
            ecc,
            remapped_rows: read(raw::remapped_rows(self.nvml, d)),
            bank_histogram: read(raw::bank_histogram(self.nvml, d)),
            retired_pages,
            xids: self.xids(),
            clock_events: read(d.current_throttle_reasons().map(|r| ClockEvents { mask: r.bits() })),
            clock_event_time: ClockEventTime {
                sw_power_cap_ns: clock(0),
                sw_thermal_ns: clock(1),
                hw_thermal_ns: clock(2),
                hw_power_brake_ns: clock(3),
            },
            sm_clock,
            temperature,
            power,
            pcie,
            nvlink,
            recovery_action: match recovery.first().copied().flatten() {
                Some(v) => Read::Value(v),
                None => Read::NotSupported,
            },
            processes: crate::readiness::processes(d, self.started_us),
            settings: crate::readiness::settings(self.nvml, d),
        }
    }
}

fn pages(d: &Device<'_>, cause: RetirementCause) -> u32 {
    d.retired_pages(cause).map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)).unwrap_or(0)
}
