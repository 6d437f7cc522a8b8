//! Where the watch's readings come from: the GPUs through NVML, or, on test rigs only, a
//! replayed recording ([`super::replay`]).

use gpusanity_common::wire::gpu_id::GpuId;
use gpusanity_common::wire::watch::ForeignProcess;
use gpusanity_nvml::watch::{Instant, Period, WatchedGpu};

use super::owners::Owners;

/// One period's slow readings of a GPU, with the processes that are not the job's.
pub(crate) struct PeriodOf {
    pub period: Period,
    pub foreign: Vec<ForeignProcess>,
}

pub(crate) trait Source: Send {
    /// The GPUs watched, by UUID, in the order of every reading below.
    fn gpus(&self) -> Vec<String>;
    /// One more reading within the interval, for its means (a recording has none).
    fn sub_sample(&mut self) {}
    /// Each GPU's cheap readings for sample `k` (counted from the watch's start), over the
    /// interval that ends with it.
    fn instant(&mut self, k: u64) -> Vec<Instant>;
    /// Each GPU's slow readings at the end of a period whose last sample was `k`.
    fn period(&mut self, k: u64) -> Vec<PeriodOf>;
}

/// The job's GPUs on this node through NVML.
pub(crate) struct Nvml {
    gpus: Vec<WatchedGpu>,
    owners: Owners,
}

impl Nvml {
    /// Opens the GPUs `ids` name (every GPU of the node for none).
    pub fn open(ids: &[GpuId]) -> Result<Nvml, gpusanity_nvml::NvmlError> {
        let gpus = if ids.is_empty() {
            (0..gpusanity_nvml::device_count()?).map(WatchedGpu::by_index).collect::<Result<Vec<_>, _>>()?
        } else {
            ids.iter()
                .map(|id| match id {
                    GpuId::Uuid(u) => WatchedGpu::by_uuid(u),
                    GpuId::Pci(p) => WatchedGpu::by_pci(p),
                    GpuId::Index(i) => WatchedGpu::by_index(*i),
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(Nvml { gpus, owners: Owners::default() })
    }
}

impl Source for Nvml {
    fn gpus(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid().to_string()).collect()
    }

    fn sub_sample(&mut self) {
        self.gpus.iter_mut().for_each(WatchedGpu::sub_sample);
    }

    fn instant(&mut self, _k: u64) -> Vec<Instant> {
        self.gpus.iter_mut().map(WatchedGpu::instant).collect()
    }

    fn period(&mut self, _k: u64) -> Vec<PeriodOf> {
        let periods: Vec<Period> = self.gpus.iter_mut().map(WatchedGpu::period).collect();
        let pids: Vec<Vec<(u32, Option<u64>)>> = periods.iter().map(|p| p.processes.clone()).collect();
        let foreign = self.owners.foreign(&pids);
        periods.into_iter().zip(foreign).map(|(period, foreign)| PeriodOf { period, foreign }).collect()
    }
}
