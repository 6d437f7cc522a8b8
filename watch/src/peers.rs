//! The rules against the job's other GPUs: each sampling instant ("tick": the sample's time
//! over the interval, the same on every node, since agents sample on multiples of it) gathers
//! every GPU's reading; once every GPU still reporting has given its reading of a tick (or the
//! tick is two periods old), the tick is judged: when the job's GPUs are busy, a GPU whose SM
//! clock or power draw sits below the median by more than both `mad_k` scaled deviations and
//! the relative gap is low at that tick; so is a GPU whose SM clock fell against its own usual
//! ratio to the median ([`crate::baseline`]); `min_low` low ticks among a GPU's last `window`
//! judged ones make it suspect.

use std::collections::{BTreeMap, VecDeque};

use crate::baseline::Baselines;
use crate::stats::{median, median_mad};
use crate::tick::{Figure, Judged, Reading};
use crate::JudgeConfig;

/// A GPU low at enough of its judged ticks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Low {
    pub key: usize,
    pub figure: Figure,
    /// The first tick of the window that was low.
    pub since_tick: i64,
    pub evidence: String,
}

#[derive(Debug, Clone, Copy)]
struct Mark {
    tick: i64,
    clock: Option<Judged>,
    power: Option<Judged>,
}

#[derive(Debug)]
pub(crate) struct Peers {
    /// Readings by tick, not yet judged.
    ticks: BTreeMap<i64, Vec<Reading>>,
    /// Each GPU's newest tick reported, by key.
    last_tick: Vec<i64>,
    /// Each GPU's judged ticks, newest last, at most `window`.
    marks: Vec<VecDeque<Mark>>,
    /// The newest tick reported by any GPU.
    newest: i64,
    /// The newest tick judged: a later reading of it (a late or replayed summary) is dropped.
    judged: i64,
    /// Each GPU's usual ratio of its SM clock to the job's median.
    baselines: Baselines,
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            ticks: BTreeMap::new(),
            last_tick: Vec::new(),
            marks: Vec::new(),
            newest: i64::MIN,
            judged: i64::MIN,
            baselines: Baselines::default(),
        }
    }
}

impl Peers {
    /// Adds one GPU's readings of consecutive ticks from `tick0`.
    pub fn add(&mut self, tick0: i64, readings: impl IntoIterator<Item = Reading>) {
        for (i, r) in readings.into_iter().enumerate() {
            let tick = tick0.saturating_add(i as i64);
            if self.last_tick.len() <= r.key {
                self.last_tick.resize(r.key + 1, i64::MIN);
                self.marks.resize_with(r.key + 1, VecDeque::new);
            }
            // A GPU reporting a tick already judged (its summary came late, or again) still
            // counts as reporting: the next ticks wait for it.
            self.last_tick[r.key] = self.last_tick[r.key].max(tick);
            if tick <= self.judged {
                continue;
            }
            self.newest = self.newest.max(tick);
            self.ticks.entry(tick).or_default().push(r);
        }
    }

    /// Judges every tick that is complete, or older than `grace` ticks; returns the GPUs that
    /// became low. Until `all_seen` (every node of the job has reported), no tick is complete:
    /// the GPUs known so far are not yet the job's.
    pub fn judge(&mut self, cfg: &JudgeConfig, grace: i64, stale: i64, all_seen: bool) -> Vec<Low> {
        let mut out = Vec::new();
        while let Some((&tick, readings)) = self.ticks.first_key_value() {
            let live = self.last_tick.iter().filter(|t| **t >= tick.saturating_sub(stale)).count();
            let complete = all_seen && readings.len() >= live;
            if !complete && tick > self.newest.saturating_sub(grace) {
                break;
            }
            let Some((tick, readings)) = self.ticks.pop_first() else { break };
            self.judged = tick;
            self.judge_tick(cfg, tick, &readings, &mut out);
        }
        out
    }

    fn judge_tick(&mut self, cfg: &JudgeConfig, tick: i64, readings: &[Reading], out: &mut Vec<Low>) {
        let busy: Vec<&Reading> =
            readings.iter().filter(|r| r.util.is_some_and(|u| u >= cfg.busy_pct) && r.sm_mhz.is_some()).collect();
        let mut utils: Vec<f64> = readings.iter().filter_map(|r| r.util.map(f64::from)).collect();
        let job_busy = median(&mut utils).is_some_and(|u| u >= f64::from(cfg.busy_pct));
        if busy.len() < cfg.min_peers || !job_busy {
            return;
        }
        let mut clocks = against_peers(&busy, |r| r.sm_mhz, cfg.clock_gap, cfg.mad_k);
        self.baselines.judge(cfg, &busy, &mut clocks);
        let powers = against_peers(&busy, |r| r.power_w, cfg.power_gap, cfg.mad_k);
        for (i, r) in busy.iter().enumerate() {
            let marks = &mut self.marks[r.key];
            marks.push_back(Mark { tick, clock: clocks[i], power: powers[i] });
            while marks.len() > cfg.window as usize {
                marks.pop_front();
            }
            for figure in [Figure::Clock, Figure::Power] {
                if let Some(low) = persistent(cfg, r.key, marks, figure) {
                    out.push(low);
                }
            }
        }
    }
}

/// Each reading judged against the others' median and spread (None where it has no value).
fn against_peers(busy: &[&Reading], value: impl Fn(&Reading) -> Option<f64>, gap: f64, k: f64) -> Vec<Option<Judged>> {
    let values: Vec<f64> = busy.iter().filter_map(|r| value(r)).collect();
    let Some((median, spread)) = (values.len() >= 2).then(|| median_mad(&values)).flatten() else {
        return vec![None; busy.len()];
    };
    let floor = median - (k * spread).max(gap * median);
    busy.iter().map(|r| value(r).map(|v| Judged { low: v < floor, value: v, median, spread, own: None })).collect()
}

/// Whether `min_low` of the GPU's last `window` judged ticks were low in `figure`.
fn persistent(cfg: &JudgeConfig, key: usize, marks: &VecDeque<Mark>, figure: Figure) -> Option<Low> {
    let pick = |m: &Mark| match figure {
        Figure::Clock => m.clock,
        Figure::Power => m.power,
    };
    // The ticks low by either rule; of them, those low against the peers (and the last one) and
    // the last one low against the GPU's own ratio.
    let (mut judged, mut lows, mut peer_lows, mut first, mut last_peer, mut last_own) =
        (0usize, 0usize, 0usize, None, None, None);
    for m in marks {
        if let Some(j) = pick(m) {
            judged += 1;
            if j.is_low() {
                lows += 1;
                first.get_or_insert(m.tick);
            }
            if j.low {
                peer_lows += 1;
                last_peer = Some(j);
            }
            if let Some(o) = j.own.filter(|o| o.low) {
                last_own = Some((j, o));
            }
        }
    }
    if lows < cfg.min_low as usize {
        return None;
    }
    let since_tick = first?;
    let (what, unit) = match figure {
        Figure::Clock => ("SM clock", "MHz"),
        Figure::Power => ("power draw", "W"),
    };
    // The rule against the peers is named where it alone would have made the GPU suspect; else
    // the GPU's own ratio, which it took.
    let evidence = if peer_lows >= cfg.min_low as usize {
        let j = last_peer?;
        format!(
            "{what} {:.0} {unit} against the job's median {:.0} {unit} (spread {:.0} {unit}), low in {lows} of its last {judged} busy instants",
            j.value, j.median, j.spread
        )
    } else {
        let (j, o) = last_own?;
        format!(
            "{what} {:.0} {unit}, below its own usual ratio to the job's median ({:.3}) at {:.3} of {:.0} {unit} (residual spread {:.3}), low in {lows} of its last {judged} busy instants",
            j.value,
            o.usual,
            j.value / j.median,
            j.median,
            o.spread
        )
    };
    Some(Low { key, figure, since_tick, evidence })
}
