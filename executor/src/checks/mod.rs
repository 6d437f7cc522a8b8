//! The check items, one module each, run by a worker over its [`DeviceBackend`], and the
//! helpers they share: progress reporting, fault injection for tests, fill patterns; [`remeasure`] runs a
//! check and re-runs it before a slow rank is named, [`pair_schedule`] orders the link test.
//! What each check is (its configuration, metric, codes) is its descriptor in
//! [`gpusanity_common::checks`].

pub mod collective;
pub mod cpu_time;
pub mod models;
pub mod pair_schedule;
pub mod probe_plan;
pub mod remeasure;

/// One module per check, named as its descriptor module in [`gpusanity_common::registry`]'s
/// list, each with `pub fn run(&mut CheckCtx) -> anyhow::Result<RankResult>`: a new check is
/// its file here, with nothing to add to this one.
macro_rules! check_modules {
    ($($id:ident = $name:literal => $module:ident,)+) => {
        $(pub mod $module;)+

        /// Runs the module of check `id`.
        fn dispatch(id: CheckId, ctx: &mut CheckCtx<'_>) -> anyhow::Result<RankResult> {
            match id {
                $(CheckId::$id => $module::run(ctx),)+
            }
        }
    };
}
gpusanity_common::registry::for_each_check!(check_modules);

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckStatus, RankResult};

use crate::backend::{DeviceBackend, WorkerPlace};
use crate::store::Rounds;

/// Barriers inside a check wait as long as a run may last: the launcher, not the worker,
/// decides when a wait has become a hang.
pub const BARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Reports where a check is (the worker forwards it to its launcher).
pub trait Progress {
    fn phase(&self, check: CheckId, phase: &str, step: u64);
}

/// Everything a check needs.
pub struct CheckCtx<'a> {
    pub backend: &'a mut dyn DeviceBackend,
    /// Node 0's store (by deref) and the world-wide rounds through this node's store.
    pub store: &'a mut Rounds,
    pub place: &'a WorkerPlace,
    pub configs: &'a CheckConfigs,
    pub progress: &'a dyn Progress,
    pub faults: &'a Faults,
    /// The GPU's health reader, started with the worker when `gpu-health` is selected on a
    /// GPU (`None` otherwise, or when NVML could not be read: the error).
    pub health: Option<&'a Result<gpusanity_nvml::Monitor, gpusanity_nvml::NvmlError>>,
    /// The GPU's figures sampled while an earlier check of this worker loaded it (`gemm`'s
    /// products), which `gpu-health` reads instead of running a load of its own.
    pub load: &'a mut Option<gpu_health::EarlierLoad>,
    /// What the worker read before its first check.
    pub baseline: &'a Baseline,
    /// When the launcher stops this check as hung (its per-test limit, counted by this worker
    /// from the check's start), if the launcher said: [`remeasure`] takes a further
    /// measurement only where it ends well before.
    pub limit: Option<std::time::Instant>,
}

/// What a worker reads when it starts: for checks that report what changed over the run, and
/// what rank 0 judges the first measurements against before a re-measure.
#[derive(Debug, Default)]
pub struct Baseline {
    /// The RDMA ports and their counters (local rank 0, when `rdma-ports` is selected).
    pub rdma: Option<rdma_ports::Snapshot>,
    /// The fleet baseline's entries of the run's checks (rank 0 of a run with `--baseline`,
    /// [`crate::protocol::WorkerSpec::fleet_baseline`]): [`remeasure`] re-measures a check
    /// before a rank is found below its fleet floor.
    pub fleet: Option<gpusanity_common::fleet::file::BaselineFile>,
}

/// Runs the check `id` on this rank. Errors become a rank result with status `Error`.
pub fn run(id: CheckId, ctx: &mut CheckCtx<'_>) -> RankResult {
    let rank = ctx.place.rank;
    run_check(id, ctx).unwrap_or_else(|e| {
        let mut r = RankResult::new(rank, CheckStatus::Error);
        r.error = Some(format!("{e:#}"));
        r
    })
}

fn run_check(id: CheckId, ctx: &mut CheckCtx<'_>) -> anyhow::Result<RankResult> {
    if let Some(why) = id.descriptor().needs.unmet(ctx.place.world, ctx.place.node_sizes.len()) {
        return Ok(not_applicable(ctx.place.rank, why));
    }
    dispatch(id, ctx)
}

/// A rank result that says why the check does not apply here.
pub fn not_applicable(rank: usize, why: String) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::NotApplicable);
    r.notes.insert("not_applicable".into(), why);
    r
}

/// Injected faults, from `GPUSANITY_FAULT=KIND@RANK,...`. Each makes the rank misbehave for
/// real, through the same code paths a broken device would take:
/// - `gemm-wrong`: flips one element of the product before verification;
/// - `gemm-slow`: runs every timed product eight times (the device really does the work);
/// - `memory-bandwidth-slow`: every timed copy eight times; `host-bandwidth-slow`: four times;
/// - `memory-bandwidth-wrong`: overwrites one byte of the copy's destination before
///   verification;
/// - `all-reduce-wrong`, `all-gather-wrong`, `reduce-scatter-wrong`, `all-to-all-wrong`:
///   corrupts one received element
///   before verification;
/// - `multi-all-reduce-wrong`: corrupts one element of this rank's first group's sum;
/// - `overlap-wrong`: corrupts one element of the all-reduce run under overlap;
/// - `net-closed`: the front-end listener of this rank's node is closed (its port refuses);
/// - `net-backend-down`: this rank does not answer back-end probes (its peers time out);
/// - `exit`: the worker exits with status 17 when it starts its first check;
/// - `hang`: the worker sleeps forever at the start of its first check (heartbeats continue);
/// - `model-nan`: a model check poisons a parameter with NaN before the forward of step
///   steps / 3;
/// - `model-corrupt`: a model check flips a bit of one parameter after training, before the
///   parameter checksum;
/// - `model-slow`: a model check runs each step's forward and backward six times.
/// - `gemm-extra-PCT` (e.g. `gemm-extra-10`): the timed window also holds PCT% more products
///   (of the timed count, rounded), a device that much slower; for a fleet's drift, set on an
///   agent's own environment by a test rig and stepped from one agent start to the next.
/// - `KIND-once` (e.g. `gemm-slow-once`): `KIND` in the first measurement of a check only, not
///   when the diagnosis re-measures it (a transient blip); `KIND-twice`: in the first and the
///   re-measure, not in the further measurements of a rank still slow or below its fleet floor
///   (contention that outlasts two measurements back to back).
///
/// Beside them, `GPUSANITY_TEST_IB_ROOT=DIR` makes `rdma-ports` read a fake
/// /sys/class/infiniband, and `GPUSANITY_TEST_PACE=MFLOPS` makes a CPU worker a device of that
/// GEMM speed (`backend/cpu/pace.rs`: a fleet of known, realistic noise on a host whose own
/// speed varies). The launcher passes these variables to its workers only with `--test-faults`.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    kinds: Vec<(String, usize)>,
    ib_root: Option<std::path::PathBuf>,
}

impl Faults {
    pub fn parse(spec: &str) -> Faults {
        Faults {
            kinds: spec
                .split(',')
                .filter_map(|item| item.trim().split_once('@'))
                .filter_map(|(k, r)| r.parse().ok().map(|r| (k.to_string(), r)))
                .collect(),
            ib_root: None,
        }
    }

    pub fn from_env() -> Faults {
        let mut f = std::env::var(crate::protocol::FAULT_ENV).map(|s| Faults::parse(&s)).unwrap_or_default();
        f.ib_root = std::env::var_os(rdma_ports::IB_ROOT_ENV).filter(|v| !v.is_empty()).map(Into::into);
        f
    }

    /// The faults of a check's `k`th measurement (0: the first, 1: the re-measure, then the
    /// further ones): `KIND-once` acts as `KIND` in the first, `KIND-twice` in the first two.
    pub fn attempt(&self, k: usize) -> Faults {
        let mut kinds = self.kinds.clone();
        let suffixes: &[&str] = match k {
            0 => &["-once", "-twice"],
            1 => &["-twice"],
            _ => &[],
        };
        for suffix in suffixes {
            kinds.extend(self.kinds.iter().filter_map(|(k, r)| k.strip_suffix(suffix).map(|k| (k.to_string(), *r))));
        }
        Faults { kinds, ib_root: self.ib_root.clone() }
    }

    pub fn has(&self, kind: &str, rank: usize) -> bool {
        self.kinds.iter().any(|(k, r)| k == kind && *r == rank)
    }

    /// PCT of a `PREFIX-PCT` fault on `rank` (e.g. `gemm-extra-10`: 10), at most 1,000.
    pub fn percent(&self, prefix: &str, rank: usize) -> Option<u32> {
        self.kinds
            .iter()
            .filter(|(_, r)| *r == rank)
            .filter_map(|(k, _)| k.strip_prefix(prefix)?.strip_prefix('-'))
            // Digits only: `parse` alone would take "+5".
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| *p <= 1000)
    }

    /// The fake /sys/class/infiniband of the tests, if one is set.
    pub fn ib_root(&self) -> Option<&std::path::PathBuf> {
        self.ib_root.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::Faults;

    #[test]
    fn a_percent_fault_reads_its_rank_and_refuses_what_is_not_a_percent() {
        let f = Faults::parse("gemm-extra-10@0,gemm-extra-5@1,gemm-slow@2");
        assert_eq!((f.percent("gemm-extra", 0), f.percent("gemm-extra", 1)), (Some(10), Some(5)));
        assert_eq!(f.percent("gemm-extra", 2), None, "another kind");
        assert_eq!(f.percent("gemm", 0), None, "a prefix is the whole name before the percent");
        for bad in [
            "gemm-extra@0",
            "gemm-extra-@0",
            "gemm-extra--5@0",
            "gemm-extra-+5@0",
            "gemm-extra-x@0",
            "gemm-extra-1001@0",
            "gemm-extra-99999999999999999999@0",
            "gemm-extra-10@",
            "gemm-extra-10@-1",
            "gemm-extra10@0",
        ] {
            assert_eq!(Faults::parse(bad).percent("gemm-extra", 0), None, "{bad}");
        }
        assert_eq!(Faults::parse("gemm-extra-1000@0").percent("gemm-extra", 0), Some(1000));
    }

    #[test]
    fn a_once_fault_acts_in_the_first_measurement_and_a_twice_fault_in_the_first_two() {
        let f = Faults::parse("gemm-slow-once@0,gemm-slow-twice@1,gemm-wrong@2");
        let slow = |k: usize| (0..3).filter(|r| f.attempt(k).has("gemm-slow", *r)).collect::<Vec<_>>();
        assert_eq!((slow(0), slow(1), slow(2), slow(4)), (vec![0, 1], vec![1], vec![], vec![]));
        assert!((0..5).all(|k| f.attempt(k).has("gemm-wrong", 2)), "a plain fault acts in every measurement");
        assert!(!f.has("gemm-slow", 0) && !f.has("gemm-slow", 1), "not outside a measurement's faults");
    }
}
