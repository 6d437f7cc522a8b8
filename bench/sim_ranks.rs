//! The synthetic ranks of a simulated run of the default check (gemm, all-reduce,
//! network-connectivity on H200-like figures with a little noise), shared by the simulators
//! (bench/scale_sim.rs, bench/sim_agents.rs) that include this file as a module, and the peak
//! resident set they print.

use std::collections::BTreeMap;

use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckDetail, CheckStatus, NodeInfo, RankInfo, RankResult, SweepPoint};
use gpusanity_executor::launcher::outcome::NodeOutcome;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub const CHECKS: [CheckId; 3] = [CheckId::Gemm, CheckId::AllReduce, CheckId::NetworkConnectivity];
pub const DEVICE: &str = "NVIDIA H200";

/// Node `k`'s outcome: its ranks and their synthetic results of the default check.
pub fn outcome(k: usize, nodes: &[NodeInfo], gpus: usize) -> NodeOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(k as u64);
    let world: usize = nodes.iter().map(|n| n.nproc).sum();
    let ranks: Vec<usize> = (k * gpus..(k + 1) * gpus).collect();
    let host = nodes.get(k).map_or_else(|| format!("node-{k}"), |n| n.hostname.clone());
    let infos = ranks
        .iter()
        .map(|&rank| RankInfo {
            rank,
            node_rank: k,
            local_rank: rank - k * gpus,
            host: host.clone(),
            device: DEVICE.into(),
            pid: 1000 + rank as u32,
            link: None,
        })
        .collect();
    let mut noise = |centre: f64| centre * (1.0 + 0.01 * (rng.random::<f64>() - 0.5));
    let checks = CHECKS
        .iter()
        .map(|check| {
            let results = ranks
                .iter()
                .map(|&rank| {
                    let mut r = RankResult::new(rank, CheckStatus::Passed);
                    let m = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
                        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
                    };
                    match check {
                        CheckId::Gemm => {
                            let t = noise(686.0);
                            r.metrics =
                                m(&[("tflops", t), ("tflops_best", t), ("tflops_median", t), ("wrong_elements", 0.0)]);
                            r.notes.insert("dtype".into(), "bf16".into());
                            r.detail = Some(CheckDetail::Gemm { result_hash: "b2723ba0db646e57".into() });
                        }
                        CheckId::AllReduce => {
                            let bw = noise(360.0);
                            r.metrics = m(&[("busbw_gbps", bw), ("busbw_gbps_peak", bw), ("wrong_elements", 0.0)]);
                            r.sweep = [1u64 << 20, 1 << 24, 1 << 28]
                                .iter()
                                .map(|&bytes| SweepPoint {
                                    bytes,
                                    time_us: bytes as f64 / (bw * 1e3),
                                    algbw_gbps: bw / 2.0,
                                    busbw_gbps: bw,
                                    wrong: 0,
                                })
                                .collect();
                        }
                        _ => {
                            let probes = (world / gpus).min(64) as f64;
                            r.metrics = m(&[
                                ("front_probes", probes),
                                ("front_failed", 0.0),
                                ("front_ms_max", noise(0.2)),
                                ("back_probes", probes),
                                ("back_failed", 0.0),
                                ("back_ms_max", noise(0.05)),
                            ]);
                        }
                    }
                    r
                })
                .collect();
            (noise(5.0), results)
        })
        .collect();
    NodeOutcome { node_rank: k, ranks: infos, checks, stop: None, host: None }
}

pub fn node_info(k: usize, gpus: usize) -> NodeInfo {
    NodeInfo {
        node_rank: k,
        hostname: format!("node-{k}"),
        addr: format!("10.{}.{}.{}", k >> 16, (k >> 8) & 255, k & 255),
        nproc: gpus,
    }
}

/// A process's peak resident set (VmHWM), MiB.
pub fn peak_rss_mib(pid: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}
