//! The fleet judgement over a simulated H200 fleet (docs/benchmarks/fleet.md): how often a
//! healthy run falls below its fleet baseline (the false-positive rate), how often one device
//! 5% or 10% slow does (the recall), for several k, and what learning a baseline costs per run.
//!
//! The healthy figure is drawn from what gpusanity's GEMM check measured on H200s
//! (`gpusanity_common::fleet::noise::H200_GEMM`: a device offset per node, a day offset shared
//! by every node for 50 runs, a run's own noise, and a heavier tail from PyTorch's loop), so that
//! ten runs span about the range measured. Each trial learns a baseline from a window of such
//! runs from 16 nodes and judges fresh runs against it.
//!
//! Usage: fleet_sim [TRIALS] [RUNS_PER_TRIAL] [SEED]

use std::time::Instant;

use gpusanity_common::fleet::noise::{standard_normal, Spread, H200_GEMM};
use gpusanity_common::fleet::{learn, Judging, Learned, Policy, Sample};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MODEL: Spread = H200_GEMM;
const NODES: usize = 16;
const RUNS_PER_DAY: usize = 50;

struct Fleet {
    rng: ChaCha8Rng,
    nodes: Vec<f64>,
    day: f64,
    runs_today: usize,
}

impl Fleet {
    fn new(rng: ChaCha8Rng) -> Fleet {
        let mut f = Fleet { rng, nodes: Vec::new(), day: 0.0, runs_today: 0 };
        f.nodes = (0..NODES).map(|_| MODEL.node_sd * f.normal()).collect();
        f.day = MODEL.day_sd * f.normal();
        f
    }

    fn normal(&mut self) -> f64 {
        standard_normal(&mut || self.rng.random())
    }

    /// One run of node `n`, `factor` x its healthy figure.
    fn run(&mut self, n: usize, factor: f64) -> f64 {
        self.runs_today += 1;
        if self.runs_today > RUNS_PER_DAY {
            self.runs_today = 0;
            self.day = MODEL.day_sd * self.normal();
        }
        let offset = self.nodes[n] + self.day;
        factor * MODEL.measure(offset, &mut || self.rng.random())
    }

    fn baseline(&mut self, policy: Policy) -> Option<Learned> {
        let window: Vec<Sample> = (0..policy.window)
            .map(|i| {
                let n = i % NODES;
                Sample { node: format!("node-{n}"), value: self.run(n, 1.0) }
            })
            .collect();
        learn(&window, policy)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let trials: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(500);
    let runs: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(33);
    let policy = Policy::default();
    let ks = [3.09, 3.5, 4.0, 4.5, 5.0];
    let gaps = [0.0, 0.03];
    println!(
        "fleet_sim: {trials} baselines x {runs} judged runs each (healthy, and one node 5% / 10% slow), window {} \
         (least {} samples of {} nodes), seed {seed}",
        policy.window, policy.min_samples, policy.min_nodes
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // [gap][k] -> (false positives, 5% slow caught, 10% slow caught)
    let mut counts = vec![vec![(0usize, 0usize, 0usize); ks.len()]; gaps.len()];
    let (mut centres, mut spreads) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        let mut fleet = Fleet::new(ChaCha8Rng::seed_from_u64(rng.random()));
        let b = fleet.baseline(policy).ok_or("no baseline learned")?;
        centres.push(b.centre);
        spreads.push(b.spread);
        for _ in 0..runs {
            let n = fleet.rng.random_range(0..NODES);
            let healthy = fleet.run(n, 1.0);
            let slow5 = fleet.run(n, 0.95);
            let slow10 = fleet.run(n, 0.90);
            for (g, gap) in gaps.iter().enumerate() {
                for (i, k) in ks.iter().enumerate() {
                    let floor = Judging { k: *k, min_gap: *gap }.floor(b.centre, b.spread);
                    let c = &mut counts[g][i];
                    c.0 += usize::from(healthy < floor);
                    c.1 += usize::from(slow5 < floor);
                    c.2 += usize::from(slow10 < floor);
                }
            }
        }
    }
    let stat = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (s[0], s[s.len() / 2], s[s.len() - 1])
    };
    let (c0, c1, c2) = stat(&centres);
    let (s0, s1, s2) = stat(&spreads);
    println!("learned centre min/median/max {c0:.1} / {c1:.1} / {c2:.1} TFLOP/s; spread {s0:.2} / {s1:.2} / {s2:.2}");
    let total = (trials * runs) as f64;
    println!("| min_gap | k | false positives (healthy runs below) | recall, one device 5% slow | recall, 10% slow |");
    println!("|---|---|---|---|---|");
    for (g, gap) in gaps.iter().enumerate() {
        for (i, k) in ks.iter().enumerate() {
            let (fp, r5, r10) = counts[g][i];
            println!(
                "| {gap} | {k} | {:.3}% ({fp} of {total}) | {:.2}% | {:.2}% |",
                100.0 * fp as f64 / total,
                100.0 * r5 as f64 / total,
                100.0 * r10 as f64 / total
            );
        }
    }
    // The cost of learning a baseline at read time: the window's median and MAD.
    let mut fleet = Fleet::new(ChaCha8Rng::seed_from_u64(seed));
    let window: Vec<Sample> = (0..policy.window)
        .map(|i| Sample { node: format!("node-{}", i % NODES), value: fleet.run(i % NODES, 1.0) })
        .collect();
    let reps = 20_000;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(learn(std::hint::black_box(&window), policy));
    }
    println!(
        "learning one baseline from a window of {}: {:.1} µs",
        policy.window,
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    );
    Ok(())
}
