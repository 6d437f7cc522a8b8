//! How hard a model check loaded its GPU: power draw and SM clock sampled through NVML on a
//! thread during the timed steps only (after the warm-up), reported per rank as
//! `power_w_mean`, `power_w_max`, `power_samples`, `sm_mhz_mean`, `sm_mhz_max` and
//! `sm_mhz_samples`.
//!
//! Nothing here can fail or change a check's verdict: without a GPU (the CPU backend), without
//! NVML, or when a reading fails, the figures are absent and a note says why; none is made up.

use std::time::Duration;

use gpusanity_common::report::RankResult;
use gpusanity_nvml::{LoadSamples, Sampler};

use crate::backend::DeviceBackend;
use crate::checks::gpu_health::pci_bus_id;

/// How often the sampler reads the GPU.
const PERIOD: Duration = Duration::from_millis(20);

/// The note that says why the figures are absent.
pub const NOT_SAMPLED_NOTE: &str = "power_not_sampled";

/// The watch over one training run: started at the first timed step, stopped after the last.
pub struct Watch {
    /// NVML's index of the worker's GPU, or why it is not watched.
    index: Result<u32, String>,
    first_timed: usize,
    steps: usize,
    sampler: Option<Sampler>,
    samples: Option<LoadSamples>,
}

impl Watch {
    /// The watch of a run of `steps` steps whose steps from `first_timed` on are timed.
    pub fn new(backend: &dyn DeviceBackend, first_timed: usize, steps: usize) -> Watch {
        let index = match backend.cuda_device() {
            None => Err("CPU backend: no GPU whose power and SM clock NVML could read".to_string()),
            Some(dev) => pci_bus_id(&dev)
                .and_then(|id| gpusanity_nvml::index_of(&id))
                .map_err(|e| format!("NVML could not find the GPU: {e}")),
        };
        Watch { index, first_timed, steps, sampler: None, samples: None }
    }

    /// Told each step's number before the step and `steps` after the last one.
    pub fn step(&mut self, step: usize) {
        if step == self.first_timed {
            if let Ok(i) = self.index {
                self.sampler = Some(Sampler::start(i, PERIOD));
            }
        }
        if step == self.steps {
            self.samples = self.sampler.take().map(Sampler::stop);
        }
    }

    /// What was sampled, or why nothing was.
    pub fn finish(mut self) -> Result<LoadSamples, String> {
        let index = self.index.clone()?;
        match (self.samples.take(), self.sampler.take()) {
            (Some(s), _) => Ok(s),
            // The loop ended without its last call: what was sampled still counts.
            (None, Some(sampler)) => Ok(sampler.stop()),
            (None, None) => Err(format!("no timed step was run (NVML index {index})")),
        }
    }
}

/// Writes the figures of `watched` into `r`'s metrics, or a note on why there are none.
pub fn record(r: &mut RankResult, watched: Result<LoadSamples, String>, steps: &str) {
    let s = match watched {
        Ok(s) => s,
        Err(why) => {
            r.notes.insert(NOT_SAMPLED_NOTE.into(), why);
            return;
        }
    };
    for (name, fig) in [("power_w", &s.power), ("sm_mhz", &s.sm_mhz)] {
        if let Some(mean) = fig.mean() {
            r.metrics.insert(format!("{name}_mean"), mean);
            r.metrics.insert(format!("{name}_max"), fig.max);
            r.metrics.insert(format!("{}_samples", name.trim_end_matches("_w")), f64::from(fig.count));
        }
    }
    if s.power.count == 0 && s.sm_mhz.count == 0 {
        let why = s.error.clone().unwrap_or_else(|| "the sampler read nothing".into());
        r.notes.insert(NOT_SAMPLED_NOTE.into(), format!("NVML: {why}"));
        return;
    }
    if let Some(e) = &s.error {
        r.notes.insert("power_sampling_error".into(), e.clone());
    }
    let source = if s.power_instant {
        "instantaneous power (NVML_FI_DEV_POWER_INSTANT)"
    } else {
        "nvmlDeviceGetPowerUsage (a one-second average on Ampere and newer)"
    };
    r.notes.insert(
        "power_sampled".into(),
        format!("{source} and SM clock every {} ms during steps {steps}", PERIOD.as_millis()),
    );
}

#[cfg(test)]
mod tests {
    use gpusanity_common::report::CheckStatus;
    use gpusanity_nvml::Running;

    use super::*;

    fn running(values: &[f64]) -> Running {
        let mut r = Running::default();
        values.iter().for_each(|v| r.add(*v));
        r
    }

    #[test]
    fn samples_become_means_maxima_and_counts() {
        let mut r = RankResult::new(0, CheckStatus::Passed);
        let s = LoadSamples {
            samples: 3,
            power: running(&[600.0, 650.0, 700.0]),
            sm_mhz: running(&[1980.0, 1980.0, 1830.0]),
            power_instant: true,
            ..Default::default()
        };
        record(&mut r, Ok(s), "5..39");
        assert_eq!(r.metrics["power_w_mean"], 650.0);
        assert_eq!(r.metrics["power_w_max"], 700.0);
        assert_eq!(r.metrics["power_samples"], 3.0);
        assert_eq!(r.metrics["sm_mhz_mean"], 1930.0);
        assert_eq!(r.metrics["sm_mhz_max"], 1980.0);
        assert_eq!(r.metrics["sm_mhz_samples"], 3.0);
        assert!(r.notes["power_sampled"].contains("steps 5..39"));
        assert!(!r.notes.contains_key(NOT_SAMPLED_NOTE));
        assert_eq!(r.status, CheckStatus::Passed);
    }

    #[test]
    fn nothing_sampled_is_a_note_and_no_figure() {
        let mut r = RankResult::new(1, CheckStatus::Passed);
        record(&mut r, Err("CPU backend: no GPU".into()), "5..39");
        assert!(r.metrics.is_empty());
        assert_eq!(r.notes[NOT_SAMPLED_NOTE], "CPU backend: no GPU");
        let mut r = RankResult::new(1, CheckStatus::Passed);
        let failed = LoadSamples { samples: 4, error: Some("power: Unknown".into()), ..Default::default() };
        record(&mut r, Ok(failed), "5..39");
        assert!(r.metrics.is_empty());
        assert_eq!(r.notes[NOT_SAMPLED_NOTE], "NVML: power: Unknown");
        assert_eq!(r.status, CheckStatus::Passed);
        // A clock without power readings: the clock alone, and the error kept.
        let mut r = RankResult::new(1, CheckStatus::Passed);
        let half = LoadSamples { sm_mhz: running(&[1500.0]), error: Some("power: x".into()), ..Default::default() };
        record(&mut r, Ok(half), "3..19");
        assert_eq!(r.metrics.keys().collect::<Vec<_>>(), ["sm_mhz_max", "sm_mhz_mean", "sm_mhz_samples"]);
        assert_eq!(r.notes["power_sampling_error"], "power: x");
    }
}
