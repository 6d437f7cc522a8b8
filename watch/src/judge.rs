//! One job start's judgement: its GPUs by (node, GPU), the rules of one GPU on each summary, the
//! rules against the peers per tick, and each (node, code) named once.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, TimeZone, Utc};
use gpusanity_common::wire::watch::{SuspectCode, Telemetry};

use crate::peers::Peers;
use crate::stats::median;
use crate::tick::{Figure, Reading};
use crate::{rules, JudgeConfig};

/// The most GPUs one job's judgement keeps (a job of 4,096 nodes of 16 GPUs).
const MAX_GPUS: usize = 1 << 16;

/// A node the judgement suspects, once per (node, code).
#[derive(Debug, Clone, PartialEq)]
pub struct Suspicion {
    pub node: String,
    /// The GPU's UUID.
    pub gpu: String,
    pub code: SuspectCode,
    pub evidence: String,
    /// The first sample that showed it.
    pub since: DateTime<Utc>,
}

#[derive(Debug)]
pub struct JobJudge {
    cfg: JudgeConfig,
    keys: Vec<(String, String)>,
    index: HashMap<(String, String), usize>,
    /// Each GPU's newest enforced power limit.
    limits: Vec<Option<f64>>,
    peers: Peers,
    raised: HashSet<(String, SuspectCode)>,
    limits_median: Option<f64>,
    /// The nodes of the job, when known: until each has reported, the peers of an instant are
    /// judged only once it is [`Peers::judge`]'s grace old (a node that never reports does not
    /// stop the judgement).
    expected_nodes: Option<usize>,
    nodes_seen: HashSet<String>,
    /// The start of the first summary judged.
    first: Option<DateTime<Utc>>,
}

impl JobJudge {
    pub fn new(cfg: JudgeConfig) -> Self {
        JobJudge {
            cfg,
            keys: Vec::new(),
            index: HashMap::new(),
            limits: Vec::new(),
            peers: Peers::default(),
            raised: HashSet::new(),
            limits_median: None,
            expected_nodes: None,
            nodes_seen: HashSet::new(),
            first: None,
        }
    }

    /// A judgement of a job of `nodes` nodes: the first period's instants wait for every node's
    /// summary (or their grace), so that the first node to report is not judged among its own
    /// GPUs alone.
    pub fn expecting(mut self, nodes: usize) -> Self {
        self.expected_nodes = Some(nodes);
        self
    }

    /// Whether every node of the job has reported (always, for a job of unknown size).
    fn all_seen(&mut self, node: &str) -> bool {
        let Some(n) = self.expected_nodes else { return true };
        if self.nodes_seen.len() < n && !self.nodes_seen.contains(node) && self.nodes_seen.len() < MAX_GPUS {
            self.nodes_seen.insert(node.to_string());
        }
        self.nodes_seen.len() >= n
    }

    /// Whether the job's power limits can be compared: every node has reported, or three
    /// periods have passed since the first summary (a node that never reports does not stop it).
    fn settled(&mut self, t: &Telemetry, all_seen: bool, span: i64) -> bool {
        let first = *self.first.get_or_insert(t.from);
        let waited = chrono::Duration::milliseconds(span.saturating_mul(3).saturating_mul(i64::from(t.interval_ms)));
        all_seen || t.from >= first + waited
    }

    /// Judges one node's summary (already validated); returns what it newly makes suspect.
    pub fn observe(&mut self, t: &Telemetry) -> Vec<Suspicion> {
        let mut out = Vec::new();
        let interval = i64::from(t.interval_ms.max(1));
        let tick0 = t.from.timestamp_millis().saturating_add(interval / 2).div_euclid(interval);
        let mut span = 1;
        for g in &t.gpus {
            let Some(key) = self.key(&t.node, &g.gpu) else { continue };
            for (code, evidence) in rules::judge(&self.cfg, g) {
                self.raise(&mut out, key, code, evidence, t.from);
            }
            if let Some(l) = g.power_limit_w {
                if self.limits[key] != Some(f64::from(l)) {
                    self.limits_median = None;
                }
                self.limits[key] = Some(f64::from(l));
            }
            span = span.max(g.sm_mhz.len() as i64);
            let readings = (0..g.sm_mhz.len()).map(|i| Reading {
                key,
                sm_mhz: g.sm_mhz[i].map(f64::from),
                power_w: g.power_w.get(i).copied().flatten().map(f64::from),
                util: g.util_pct.get(i).copied().flatten(),
            });
            self.peers.add(tick0, readings);
        }
        let all_seen = self.all_seen(&t.node);
        if self.settled(t, all_seen, span) {
            self.power_limits(&mut out, t);
        }
        for low in self.peers.judge(&self.cfg, 2 * span, 3 * span, all_seen) {
            let code = match low.figure {
                Figure::Clock => SuspectCode::WatchSlowClock,
                Figure::Power => SuspectCode::WatchLowPower,
            };
            let since = Utc.timestamp_millis_opt(low.since_tick.saturating_mul(interval)).single().unwrap_or(t.from);
            self.raise(&mut out, low.key, code, low.evidence, since);
        }
        out
    }

    /// The GPU's key; None once the judgement holds [`MAX_GPUS`] GPUs.
    fn key(&mut self, node: &str, gpu: &str) -> Option<usize> {
        let k = (node.to_string(), gpu.to_string());
        if let Some(i) = self.index.get(&k) {
            return Some(*i);
        }
        if self.keys.len() >= MAX_GPUS {
            return None;
        }
        self.keys.push(k.clone());
        self.limits.push(None);
        self.index.insert(k, self.keys.len() - 1);
        Some(self.keys.len() - 1)
    }

    /// A GPU of this node whose enforced power limit is below the job's median limit.
    fn power_limits(&mut self, out: &mut Vec<Suspicion>, t: &Telemetry) {
        let m = match self.limits_median {
            Some(m) => m,
            None => {
                let mut all: Vec<f64> = self.limits.iter().flatten().copied().collect();
                if all.len() < 2 {
                    return;
                }
                let Some(m) = median(&mut all) else { return };
                self.limits_median = Some(m);
                m
            }
        };
        for g in &t.gpus {
            let Some(&key) = self.index.get(&(t.node.clone(), g.gpu.clone())) else { continue };
            if let Some(l) = self.limits[key].filter(|l| *l < m * (1.0 - self.cfg.limit_gap)) {
                let e = format!("enforced power limit {l:.0} W against the job's median {m:.0} W");
                self.raise(out, key, SuspectCode::WatchPowerLimitLow, e, t.from);
            }
        }
    }

    fn raise(
        &mut self,
        out: &mut Vec<Suspicion>,
        key: usize,
        code: SuspectCode,
        evidence: String,
        since: DateTime<Utc>,
    ) {
        let (node, gpu) = &self.keys[key];
        if self.raised.insert((node.clone(), code)) {
            out.push(Suspicion { node: node.clone(), gpu: gpu.clone(), code, evidence, since });
        }
    }
}
