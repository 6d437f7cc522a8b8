//! Seeds a service database's fleet through the db crate's own insert (the one the coordinator
//! uses when a passed run ends), for the fleet page's cost at fleet scale
//! (bench/fleet_page.sh, docs/benchmarks/fleet.md): NODES nodes of 8 ranks, RUNS passed
//! single-node runs per node, each rank's GEMM figure drawn from the H200 spread (centre 686,
//! sd 4) and each node's all-reduce figure (one key per check); node-7 runs 10% slow.
//!
//! Usage: fleet_seed DATABASE_URL [NODES] [RUNS]

use anyhow::Context;
use gpusanity_common::expected::Conditions;
use gpusanity_common::fleet::samples::Learnable;
use gpusanity_common::fleet::Key;
use gpusanity_common::registry::CheckId;
use gpusanity_db::{fleet, Db};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Runs per transaction.
const BATCH: usize = 500;

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    // Box-Muller: one standard normal draw (rand_distr is not a dependency of the workspace).
    let (u, v): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).context("usage: fleet_seed DATABASE_URL [NODES] [RUNS]")?;
    let nodes: usize = args.get(2).map_or(Ok(10_000), |s| s.parse()).context("NODES")?;
    let runs: usize = args.get(3).map_or(Ok(2), |s| s.parse()).context("RUNS")?;
    let db = Db::connect(url).await.context("database")?;
    let when = Conditions { size: Some(8192), nodes: 1, ranks_per_node: Some(8), ..Conditions::default() };
    let gemm = Key::new("NVIDIA H200", Some(580), CheckId::Gemm, "tflops", when);
    let ar_when = Conditions { max_bytes: Some(1 << 30), ..when };
    let ar = Key::new("NVIDIA H200", Some(580), CheckId::AllReduce, "busbw_gbps", ar_when);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let start = std::time::Instant::now();
    let all: Vec<(usize, usize)> = (0..runs).flat_map(|r| (0..nodes).map(move |n| (r, n))).collect();
    for chunk in all.chunks(BATCH) {
        let mut tx = db.begin().await?;
        for &(r, n) in chunk {
            let node = format!("node-{n}");
            let slow = if n == 7 { 0.9 } else { 1.0 };
            let mut samples: Vec<Learnable> = (0..8)
                .map(|rank| Learnable {
                    rank,
                    node: node.clone(),
                    key: gemm.clone(),
                    value: slow * (686.0 + 4.0 * normal(&mut rng)),
                })
                .collect();
            let value = slow * (480.0 + 3.0 * normal(&mut rng));
            samples.push(Learnable { rank: 0, node: node.clone(), key: ar.clone(), value });
            fleet::add_samples(&mut tx, &format!("seed-{r}-{n}"), &samples).await?;
        }
        tx.commit().await?;
    }
    let rows = db.fleet_sample_count().await?;
    println!("seeded {rows} samples ({nodes} nodes, {runs} runs each) in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
