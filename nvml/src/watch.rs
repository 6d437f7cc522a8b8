//! The watch's readings of one GPU while a job runs (docs/watch.md): cheap ones every interval
//! ([`WatchedGpu::instant`]: SM clock and power over the interval, utilization, clock-event
//! reasons) and the rest once a period ([`WatchedGpu::period`]: power limit, temperature,
//! memory, counter increases since the last period, XIDs, the compute processes). Nothing here touches the job's
//! processes: NVML reads are the driver's own counters.

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::{Device, EventSet};

use crate::interval::Mean;
use crate::{nvml, raw, NvmlError};

/// The most XIDs kept from one period.
const MAX_XIDS: usize = 16;
/// The most processes read per GPU and period.
const MAX_PROCESSES: usize = 64;

/// One sample of the cheap readings; a reading the driver lacks is None.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Instant {
    /// The mean of the SM clock read at this instant and at each [`WatchedGpu::sub_sample`]
    /// since the last.
    pub sm_mhz: Option<u32>,
    /// The mean of the power draw read at this instant and at each sub-sample since the last.
    pub power_w: Option<f32>,
    pub util_pct: Option<u8>,
    /// `nvmlClocksEventReason*` bits.
    pub reasons: Option<u64>,
}

/// What a period adds: the slow readings and the counters' increases since the last period.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Period {
    pub power_limit_w: Option<f32>,
    pub temp_c: Option<u32>,
    pub mem_used_mib: Option<u64>,
    pub ecc_uncorrected: u64,
    pub remapped_uncorrectable: u64,
    pub pcie_replay: u64,
    pub nvlink_errors: u64,
    pub xids: Vec<u64>,
    /// The compute processes on the GPU: pid and memory used, MiB.
    pub processes: Vec<(u32, Option<u64>)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    ecc_uncorrected: Option<u64>,
    remapped_uncorrectable: Option<u64>,
    pcie_replay: Option<u64>,
    nvlink_errors: Option<u64>,
}

/// One GPU under watch.
pub struct WatchedGpu {
    device: Device<'static>,
    uuid: String,
    events: Option<EventSet<'static>>,
    last: Totals,
    clock: Mean,
    power: Mean,
}

/// The increase of a counter since the last period (0 without two readings, or when it fell:
/// a GPU reset clears it).
fn rise(now: Option<u64>, then: Option<u64>) -> u64 {
    crate::monitor::delta(now, then).unwrap_or(0)
}

impl WatchedGpu {
    /// The GPU of NVML index `index`.
    pub fn by_index(index: u32) -> Result<WatchedGpu, NvmlError> {
        let nvml = nvml()?;
        let device = nvml.device_by_index(index).map_err(|e| NvmlError::call("nvmlDeviceGetHandleByIndex", e))?;
        Self::open(device)
    }

    /// The GPU of this UUID (`GPU-...`).
    pub fn by_uuid(uuid: &str) -> Result<WatchedGpu, NvmlError> {
        let nvml = nvml()?;
        let device = nvml.device_by_uuid(uuid).map_err(|e| NvmlError::call("nvmlDeviceGetHandleByUUID", e))?;
        Self::open(device)
    }

    /// The GPU at this PCI address.
    pub fn by_pci(pci: &str) -> Result<WatchedGpu, NvmlError> {
        let nvml = nvml()?;
        let device = nvml.device_by_pci_bus_id(pci).map_err(|e| NvmlError::call("nvmlDeviceGetHandleByPciBusId", e))?;
        Self::open(device)
    }

    fn open(device: Device<'static>) -> Result<WatchedGpu, NvmlError> {
        let uuid = device.uuid().map_err(|e| NvmlError::call("nvmlDeviceGetUUID", e))?;
        // Without an event set (a driver that has none, a container without the capability) the
        // watch still samples; XIDs are then not seen, and the summary says nothing of them.
        let events = crate::xid_events::open(nvml()?, &device).ok();
        let mut g = WatchedGpu {
            device,
            uuid,
            events,
            last: Totals::default(),
            clock: Mean::default(),
            power: Mean::default(),
        };
        g.last = g.totals();
        Ok(g)
    }

    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// One more reading of the SM clock and the power within the interval. One instantaneous
    /// clock reading of a GPU at its power cap moves by about 3 % from second to second with the
    /// job's steps (docs/gpu-runs/2026-12-06-one-h100-watch.txt); the mean of ten within the
    /// second moved half as much. Each read costs the driver about 2 µs of CPU on an H100. (The
    /// driver's buffer of clock samples, `nvmlDeviceGetSamples`, answered Not Found there; its
    /// energy counter, `nvmlDeviceGetTotalEnergyConsumption`, cost 3.9 ms of CPU a read: ten
    /// times the rest of the sampler.)
    pub fn sub_sample(&mut self) {
        if let Ok(mhz) = self.device.clock_info(Clock::SM) {
            self.clock.add(mhz);
        }
        if let Ok(mw) = self.device.power_usage() {
            self.power.add(mw);
        }
    }

    /// The cheap readings of the interval since the last call: the SM clock's and the power's
    /// means over its sub-samples and now.
    pub fn instant(&mut self) -> Instant {
        self.sub_sample();
        let d = &self.device;
        Instant {
            sm_mhz: self.clock.take(),
            power_w: self.power.take().map(|mw| mw as f32 / 1000.0),
            util_pct: d.utilization_rates().ok().map(|u| u8::try_from(u.gpu.min(100)).unwrap_or(100)),
            reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
        }
    }

    fn totals(&self) -> Totals {
        let d = &self.device;
        let mut nvlink: Option<u64> = None;
        for link in 0..crate::monitor::MAX_LINKS {
            let l = d.link_wrapper_for(link);
            if !l.is_active().unwrap_or(false) {
                continue;
            }
            for c in crate::monitor::NVLINK_ERRORS {
                if let Ok(v) = l.error_counter(c) {
                    nvlink = Some(nvlink.unwrap_or(0).saturating_add(v));
                }
            }
        }
        Totals {
            ecc_uncorrected: d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
            remapped_uncorrectable: nvml()
                .ok()
                .and_then(|n| raw::remapped_rows(n, d).ok())
                .map(|r| u64::from(r.uncorrectable)),
            pcie_replay: d.pcie_replay_counter().ok().map(u64::from),
            nvlink_errors: nvlink,
        }
    }

    fn xids(&self) -> Vec<u64> {
        let mut out = Vec::new();
        if let Some(set) = &self.events {
            // A broken event set keeps what it gave: the next period reads it again.
            let _ = crate::xid_events::drain(set, &mut out, MAX_XIDS);
        }
        out
    }

    /// The slow readings, and what the counters rose by since the last call.
    pub fn period(&mut self) -> Period {
        let d = &self.device;
        let now = self.totals();
        let then = std::mem::replace(&mut self.last, now);
        let processes = d
            .running_compute_processes()
            .map(|ps| {
                ps.into_iter()
                    .take(MAX_PROCESSES)
                    .map(|p| {
                        let mib = match p.used_gpu_memory {
                            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b >> 20),
                            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                        };
                        (p.pid, mib)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Period {
            power_limit_w: d.enforced_power_limit().ok().map(|mw| mw as f32 / 1000.0),
            temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
            mem_used_mib: d.memory_info().ok().map(|m| m.used >> 20),
            ecc_uncorrected: rise(now.ecc_uncorrected, then.ecc_uncorrected),
            remapped_uncorrectable: rise(now.remapped_uncorrectable, then.remapped_uncorrectable),
            pcie_replay: rise(now.pcie_replay, then.pcie_replay),
            nvlink_errors: rise(now.nvlink_errors, then.nvlink_errors),
            xids: self.xids(),
            processes,
        }
    }
}
