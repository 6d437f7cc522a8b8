//! The check items, one module each, run by a worker over its [`Backend`], and the helpers they
//! share: progress reporting, fault injection for tests, fill patterns and statistics.

pub mod all_reduce;
pub mod gemm;
pub mod models;

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::report::{CheckStatus, RankResult};

use crate::backend::{Backend, WorkerPlace};
use crate::store::StoreClient;

/// Barriers inside a check wait as long as a run may last: the launcher, not the worker,
/// decides when a wait has become a hang.
pub const BARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Reports where a check is (the worker forwards it to its launcher).
pub trait Progress {
    fn phase(&self, check: &str, phase: &str, step: u64);
}

/// Everything a check needs.
pub struct CheckCtx<'a> {
    pub backend: &'a mut dyn Backend,
    pub store: &'a mut StoreClient,
    pub place: &'a WorkerPlace,
    pub configs: &'a CheckConfigs,
    pub progress: &'a dyn Progress,
    pub faults: &'a Faults,
}

/// Runs the check `name` on this rank. Errors become a rank result with status `Error`.
pub fn run(name: &str, ctx: &mut CheckCtx<'_>) -> RankResult {
    let rank = ctx.place.rank;
    let outcome = match name {
        "gemm" => gemm::run(ctx),
        "all-reduce" => all_reduce::run(ctx),
        "mini-gpt" | "megatron-gpt" | "resnet" => models::run(name, ctx),
        other => Err(anyhow::anyhow!("check `{other}` is not implemented by this worker")),
    };
    outcome.unwrap_or_else(|e| {
        let mut r = RankResult::new(rank, CheckStatus::Error);
        r.error = Some(format!("{e:#}"));
        r
    })
}

/// Injected faults, from `GPUSANITY_FAULT=KIND@RANK,...`. Each makes the rank misbehave for
/// real, through the same code paths a broken device would take:
/// - `gemm-wrong`: flips one element of the product before verification;
/// - `gemm-slow`: runs every timed product four times (the device really does the work);
/// - `all-reduce-wrong`: corrupts one received element before verification;
/// - `exit`: the worker exits with status 17 when it starts its first check;
/// - `hang`: the worker sleeps forever at the start of its first check (heartbeats continue);
/// - `model-nan`: a model check poisons a parameter with NaN before the forward of step
///   steps / 3;
/// - `model-corrupt`: a model check flips a bit of one parameter after training, before the
///   parameter checksum;
/// - `model-slow`: a model check runs each step's forward and backward six times.
#[derive(Debug, Default, Clone)]
pub struct Faults(Vec<(String, usize)>);

impl Faults {
    pub fn parse(spec: &str) -> Faults {
        Faults(
            spec.split(',')
                .filter_map(|item| item.trim().split_once('@'))
                .filter_map(|(k, r)| r.parse().ok().map(|r| (k.to_string(), r)))
                .collect(),
        )
    }

    pub fn from_env() -> Faults {
        std::env::var(crate::protocol::FAULT_ENV).map(|s| Faults::parse(&s)).unwrap_or_default()
    }

    pub fn has(&self, kind: &str, rank: usize) -> bool {
        self.0.iter().any(|(k, r)| k == kind && *r == rank)
    }
}

/// The median of `v` (0 for an empty slice).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 }
}
