//! Each rank against its peers of the same device model: median, median absolute deviation
//! (MAD), the relative figure (measured / median) and a robust score; and (through
//! [`crate::expected`]) against the expected figure of its device model. Used by node 0's diagnosis and by the workers, which
//! decide from the same figures whether to re-measure a check before a verdict.

use std::collections::HashMap;

use crate::expected::Conditions;
use crate::kinds::Severity;
use crate::registry::CheckId;

use crate::stats::median;

/// MAD x this estimates a standard deviation for normally distributed figures.
const MAD_SCALE: f64 = 1.4826;

/// With [`MIN_PEERS_FOR_SCORE`] peers or more, a rank whose robust score is above this is not
/// named, however far below the median it looks: its peers spread as much as it does.
const MAX_SCORE: f64 = -3.0;

/// Fewer peers have no spread to speak of (the MAD of 2 or 3 figures is one of their gaps):
/// the relative figure alone decides.
const MIN_PEERS_FOR_SCORE: usize = 4;

/// Up to this many ranks of a model, each rank's peers are the others (the rank does not pull
/// the median); beyond it, every rank is judged against the whole group's statistics, computed
/// once: one rank moves the median of hundreds by a hair, and n leave-one-out medians cost n²
/// (16,384 ranks: 268 million figures sorted, on node 0 and in every worker).
const LEAVE_ONE_OUT_UP_TO: usize = 256;

/// The spread of a group of peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerStats {
    pub median: f64,
    pub mad: f64,
}

impl PeerStats {
    pub fn of(values: &[f64]) -> PeerStats {
        let mid = median(values);
        let dev: Vec<f64> = values.iter().map(|v| (v - mid).abs()).collect();
        PeerStats { median: mid, mad: median(&dev) }
    }

    /// (v - median) / (1.4826 MAD); -inf/+inf/0 when the peers do not spread at all.
    pub fn score(&self, v: f64) -> f64 {
        let sd = MAD_SCALE * self.mad;
        if sd > 0.0 {
            (v - self.median) / sd
        } else if v < self.median {
            f64::NEG_INFINITY
        } else if v > self.median {
            f64::INFINITY
        } else {
            0.0
        }
    }

    /// v / median (1 when the median is 0).
    pub fn relative(&self, v: f64) -> f64 {
        if self.median > 0.0 {
            v / self.median
        } else {
            1.0
        }
    }
}

/// A rank's figure placed against its peers and its expected value.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub rank: usize,
    pub value: f64,
    pub stats: PeerStats,
    pub expected: Option<f64>,
    /// Below the peers' band.
    pub vs_peers: Option<Severity>,
    /// Below the expected band.
    pub vs_expected: Option<Severity>,
}

impl Judged {
    pub fn severity(&self) -> Option<Severity> {
        self.vs_peers.max(self.vs_expected)
    }
}

/// The peer bands: below `critical` x median (and clear of the peers' own spread) is critical,
/// below `warn` x median a warning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerBands {
    pub warn: f64,
    pub critical: f64,
}

impl PeerBands {
    /// `slow_fraction` is the critical band; the warning band lies halfway to the median. On
    /// CPU (`noisy`) there is no warning band: two processes sharing cores spread too much.
    pub fn new(slow_fraction: f64, noisy: bool) -> PeerBands {
        let warn = if noisy { slow_fraction } else { slow_fraction + (1.0 - slow_fraction) / 2.0 };
        PeerBands { warn, critical: slow_fraction }
    }
}

/// The name of a rate measured over the CPU time a CPU worker's thread got in the timed window
/// instead of over the wall clock (`tflops` -> `tflops_cpu`): the same work, divided by the
/// seconds the rank actually ran. A CPU worker that the host's scheduler descheduled for other
/// processes loses wall time, not CPU time, so its figure per CPU-second stays with its peers'
/// (a busy machine is not a slow device), while a rank that does more work for the same result,
/// or runs on slow cores or memory, is as far below its peers per CPU-second as per wall second.
pub fn cpu_key(key: &str) -> String {
    format!("{key}_cpu")
}

/// The figure of a check's headline `key` that the fleet's baselines learn and judge: on CPU
/// workers (`cpu`) the one per CPU-second ([`cpu_key`]) where every rank measured it
/// (`measured`: one entry per rank judged), else the wall-clock figure (GPUs time themselves:
/// theirs is always the wall-clock one). The peers judge the wall clock everywhere: a node
/// whose CPU is capped (a cgroup quota, the test bed's stand-in for a slow device) gets fewer
/// CPU-seconds, not a lower rate per CPU-second, and must be named, as a GPU that gives its
/// time to another process is; the rate per CPU-second and `cpu_share` are evidence there.
pub fn judged_key(key: &str, cpu: bool, measured: impl IntoIterator<Item = bool>) -> String {
    if cpu && measured.into_iter().all(|m| m) {
        cpu_key(key)
    } else {
        key.to_string()
    }
}

/// One figure per rank: `(rank, device model, value)`.
pub type Figures = Vec<(usize, String, f64)>;

/// Judges every rank's figure (higher is better) against its peers (the other ranks of its
/// device model: the rank itself does not pull the median) and against the expected figure
/// for its model under `when`.
pub fn judge(check: CheckId, metric: &str, figures: &Figures, bands: PeerBands, when: Conditions) -> Vec<Judged> {
    // Each device model's figures, and their statistics once for a large group.
    let mut models: HashMap<&str, (Vec<f64>, Option<PeerStats>)> = HashMap::new();
    for (_, device, value) in figures {
        models.entry(device.as_str()).or_default().0.push(*value);
    }
    for (values, whole) in models.values_mut() {
        if values.len() > LEAVE_ONE_OUT_UP_TO {
            *whole = Some(PeerStats::of(values));
        }
    }
    let mut out = Vec::with_capacity(figures.len());
    for (rank, device, value) in figures {
        let (group_len, stats) = match models.get(device.as_str()) {
            Some((values, Some(whole))) => (values.len() - 1, *whole),
            _ => {
                // The rank's peers: the other ranks of its device model.
                let group: Vec<f64> =
                    figures.iter().filter(|(r, d, _)| d == device && r != rank).map(|(_, _, v)| *v).collect();
                (group.len(), PeerStats::of(&group))
            }
        };
        let vs_peers = if group_len == 0 {
            None
        } else {
            let rel = stats.relative(*value);
            let score = if group_len >= MIN_PEERS_FOR_SCORE { stats.score(*value) } else { f64::NEG_INFINITY };
            if rel < bands.critical && score < MAX_SCORE {
                Some(Severity::Critical)
            } else if rel < bands.warn && score < MAX_SCORE {
                Some(Severity::Warning)
            } else {
                None
            }
        };
        let (expected, vs_expected) = match crate::expected::judge(device, check, metric, when, *value) {
            Some((e, sev)) => (Some(e), sev),
            None => (None, None),
        };
        out.push(Judged { rank: *rank, value: *value, stats, expected, vs_peers, vs_expected });
    }
    out
}

/// A rank critical against its peers, its expected figure, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Critical {
    pub rank: usize,
    pub peers: bool,
    pub expected: bool,
}

/// The ranks that a worker re-measures for: critical against peers or expected, and which.
pub fn critical_ranks(
    check: CheckId,
    metric: &str,
    figures: &Figures,
    bands: PeerBands,
    when: Conditions,
) -> Vec<Critical> {
    judge(check, metric, figures, bands, when)
        .into_iter()
        .filter_map(|j| {
            let peers = j.vs_peers == Some(Severity::Critical);
            let expected = j.vs_expected == Some(Severity::Critical);
            (peers || expected).then_some(Critical { rank: j.rank, peers, expected })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figs(v: &[f64]) -> Figures {
        v.iter().enumerate().map(|(i, x)| (i, "cpu".to_string(), *x)).collect()
    }

    #[test]
    fn median_mad_and_score() {
        let s = PeerStats::of(&[10.0, 11.0, 9.0, 10.0, 2.0]);
        assert_eq!(s.median, 10.0);
        assert_eq!(s.mad, 1.0);
        assert!((s.score(2.0) + 8.0 / 1.4826).abs() < 1e-9);
        assert_eq!(s.relative(5.0), 0.5);
        assert_eq!(PeerStats::of(&[4.0, 4.0]).score(3.0), f64::NEG_INFINITY);
    }

    #[test]
    fn bands_name_a_slow_rank_and_spare_a_noisy_group() {
        let b = PeerBands::new(0.5, true);
        let j = judge(CheckId::Gemm, "tflops", &figs(&[10.0, 10.5, 3.0, 9.8]), b, Conditions::default());
        let named: Vec<_> = j.iter().filter(|j| j.severity().is_some()).map(|j| j.rank).collect();
        assert_eq!(named, [2]);
        // Peers that spread widely: the low one is not clear of the spread.
        let j = judge(CheckId::Gemm, "tflops", &figs(&[10.0, 2.0, 18.0, 4.0, 16.0]), b, Conditions::default());
        assert!(j.iter().all(|j| j.severity().is_none()), "{j:?}");
        // A warning band on GPU.
        let b = PeerBands::new(0.8, false);
        assert!((b.warn - 0.9).abs() < 1e-12);
        let j = judge(CheckId::Gemm, "tflops", &figs(&[100.0, 101.0, 85.0, 100.0]), b, Conditions::default());
        assert_eq!(j[2].vs_peers, Some(Severity::Warning));
    }

    #[test]
    fn cpu_workers_are_judged_per_cpu_second_where_every_rank_measured_it() {
        assert_eq!(cpu_key("tflops"), "tflops_cpu");
        assert_eq!(judged_key("tflops", true, [true, true]), "tflops_cpu");
        assert_eq!(judged_key("tflops", true, [true, false]), "tflops");
        assert_eq!(judged_key("tflops", false, [true, true]), "tflops");
    }

    #[test]
    fn a_rank_alone_is_judged_against_its_expected_figure() {
        let f = vec![(0, "NVIDIA H200".to_string(), 500.0)];
        let when = Conditions { size: Some(8192), ..Default::default() };
        let j = judge(CheckId::Gemm, "tflops", &f, PeerBands::new(0.8, false), when);
        assert_eq!((j[0].vs_peers, j[0].vs_expected, j[0].expected), (None, Some(Severity::Critical), Some(690.0)));
        let f = vec![(0, "NVIDIA H200".to_string(), 600.0)];
        let j = judge(CheckId::Gemm, "tflops", &f, PeerBands::new(0.8, false), when);
        assert_eq!(j[0].vs_expected, Some(Severity::Warning));
        let f = vec![(0, "NVIDIA H200".to_string(), 760.0), (1, "NVIDIA H200".to_string(), 300.0)];
        // Rank 1 is below both its peer's band and its expected figure's.
        let both = Critical { rank: 1, peers: true, expected: true };
        assert_eq!(critical_ranks(CheckId::Gemm, "tflops", &f, PeerBands::new(0.8, false), when), [both]);
        // Alone, a rank has no peers: critical against its expected figure only.
        let f = vec![(0, "NVIDIA H200".to_string(), 87.0)];
        let alone = Critical { rank: 0, peers: false, expected: true };
        assert_eq!(critical_ranks(CheckId::Gemm, "tflops", &f, PeerBands::new(0.8, false), when), [alone]);
    }
}
