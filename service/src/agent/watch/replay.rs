//! Test rigs only: the watch reads a recording instead of the GPUs (`GPUSANITY_WATCH_REPLAY`,
//! honoured only by an agent started with `--test-faults`, like `GPUSANITY_FAULT`). The file
//! holds JSON lines, one per GPU and second of the recording:
//!
//! ```json
//! {"s":0,"gpu":"GPU-0","sm_mhz":1980,"power_w":650,"util":100,"limit_w":700}
//! {"s":30,"gpu":"GPU-0","sm_mhz":1650,"power_w":650,"util":100,"reasons":72,"xids":[79],
//!  "foreign":[{"pid":4242,"name":"miner"}]}
//! ```
//!
//! Sample `k` of the watch reads second `k` of the recording (the last second holds on after
//! the recording ends). A watch that names its GPUs reads those of the recording, in its order,
//! as NVML would open them; a GPU the recording lacks fails the watch's start. This is how a
//! test makes one node of a simulated job throttle at a known time through the real agent,
//! service and broker.

use std::collections::BTreeMap;
use std::path::Path;

use gpusanity_common::wire::gpu_id::GpuId;
use gpusanity_common::wire::watch::{ForeignProcess, MAX_FOREIGN, MAX_XIDS};
use gpusanity_nvml::watch::{Instant, Period};
use serde::Deserialize;

use super::source::{PeriodOf, Source};

/// The environment variable that names the recording.
pub const REPLAY_ENV: &str = "GPUSANITY_WATCH_REPLAY";
/// The largest recording read.
const MAX_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    s: u64,
    gpu: String,
    #[serde(default)]
    sm_mhz: Option<u32>,
    #[serde(default)]
    power_w: Option<f32>,
    #[serde(default)]
    util: Option<u8>,
    #[serde(default)]
    limit_w: Option<f32>,
    #[serde(default)]
    reasons: Option<u64>,
    #[serde(default)]
    xids: Vec<u64>,
    #[serde(default)]
    foreign: Vec<ForeignProcess>,
}

pub(crate) struct Replay {
    gpus: Vec<String>,
    /// By second, then GPU (in `gpus`' order).
    seconds: BTreeMap<u64, Vec<Option<Line>>>,
    /// The samples of the period being gathered, for its XIDs and foreign processes.
    from_k: u64,
}

impl Replay {
    pub fn load(path: &Path, ids: &[GpuId]) -> anyhow::Result<Replay> {
        use anyhow::Context;
        let len = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?.len();
        anyhow::ensure!(len <= MAX_BYTES, "{}: {len} bytes, at most {MAX_BYTES}", path.display());
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let mut gpus: Vec<String> = Vec::new();
        let mut lines = Vec::new();
        for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let line: Line = serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))?;
            if !gpus.contains(&line.gpu) {
                anyhow::ensure!(gpus.len() < gpusanity_common::wire::watch::MAX_GPUS, "too many GPUs");
                gpus.push(line.gpu.clone());
            }
            lines.push(line);
        }
        let mut seconds: BTreeMap<u64, Vec<Option<Line>>> = BTreeMap::new();
        for line in lines {
            let slot = gpus.iter().position(|g| *g == line.gpu).unwrap_or(0);
            let row = seconds.entry(line.s).or_insert_with(|| vec![None; gpus.len()]);
            row.resize(gpus.len(), None);
            row[slot] = Some(line);
        }
        anyhow::ensure!(!seconds.is_empty(), "{}: no readings", path.display());
        let replay = Replay { gpus, seconds, from_k: 0 };
        if ids.is_empty() {
            return Ok(replay);
        }
        replay.only(ids)
    }

    /// The recording of the GPUs `ids` alone, in their order.
    fn only(self, ids: &[GpuId]) -> anyhow::Result<Replay> {
        let slots = ids
            .iter()
            .map(|id| {
                let name = id.to_string();
                self.gpus.iter().position(|g| *g == name).ok_or_else(|| anyhow::anyhow!("{name}: not in the recording"))
            })
            .collect::<anyhow::Result<Vec<usize>>>()?;
        let gpus = slots.iter().map(|&i| self.gpus[i].clone()).collect();
        let seconds = self
            .seconds
            .into_iter()
            .map(|(s, row)| (s, slots.iter().map(|&i| row.get(i).cloned().flatten()).collect()))
            .collect();
        Ok(Replay { gpus, seconds, from_k: self.from_k })
    }

    /// Second `k`'s line of GPU `g`: the newest recorded at or before `k`.
    fn line(&self, k: u64, g: usize) -> Option<&Line> {
        self.seconds.range(..=k).rev().find_map(|(_, row)| row.get(g).and_then(Option::as_ref))
    }
}

impl Source for Replay {
    fn gpus(&self) -> Vec<String> {
        self.gpus.clone()
    }

    fn instant(&mut self, k: u64) -> Vec<Instant> {
        (0..self.gpus.len())
            .map(|g| {
                let l = self.line(k, g).cloned().unwrap_or_default();
                Instant { sm_mhz: l.sm_mhz, power_w: l.power_w, util_pct: l.util, reasons: l.reasons }
            })
            .collect()
    }

    fn period(&mut self, k: u64) -> Vec<PeriodOf> {
        let from = std::mem::replace(&mut self.from_k, k + 1);
        (0..self.gpus.len())
            .map(|g| {
                // XIDs are events: those recorded in this period. The power limit and the
                // foreign processes are state: the newest line's, as every other reading.
                let mut xids: Vec<u64> = self
                    .seconds
                    .range(from..=k)
                    .filter_map(|(_, row)| row.get(g).and_then(Option::as_ref))
                    .flat_map(|l| l.xids.iter().copied())
                    .collect();
                xids.truncate(MAX_XIDS);
                let now = self.line(k, g);
                let mut foreign = now.map(|l| l.foreign.clone()).unwrap_or_default();
                foreign.truncate(MAX_FOREIGN);
                let period = Period { power_limit_w: now.and_then(|l| l.limit_w), xids, ..Default::default() };
                PeriodOf { period, foreign }
            })
            .collect()
    }
}
