//! A worker process: one per device. It opens its backend, runs the checks in order (a store
//! barrier before each so ranks start together) and reports progress, heartbeats and results
//! as JSON lines on stdout. It never enforces its own deadlines: a hung device call cannot
//! time itself out, so the launcher kills it from outside.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusanity_common::registry::CheckId;

use crate::backend;
use crate::checks::{rdma_ports, Baseline, CheckCtx, Faults, Progress, BARRIER_WAIT};
use crate::protocol::{WorkerMsg, WorkerSpec, HEARTBEAT_EVERY, SPEC_ENV};
use crate::store::{Member, Rounds, StoreClient};

/// Writes protocol lines to stdout, one whole line at a time.
#[derive(Clone)]
struct Emitter(Arc<Mutex<std::io::Stdout>>);

impl Emitter {
    fn send(&self, msg: &WorkerMsg) {
        if let (Ok(mut out), Ok(line)) = (self.0.lock(), serde_json::to_string(msg)) {
            // A closed pipe means the launcher is gone; the worker is about to be killed.
            let _ = writeln!(out, "{line}").and_then(|_| out.flush());
        }
    }
}

impl Progress for Emitter {
    fn phase(&self, check: CheckId, phase: &str, step: u64) {
        self.send(&WorkerMsg::Progress { check, phase: phase.into(), step });
    }
}

/// Entry point of `gpusanity worker` (hidden): the spec comes in `GPUSANITY_WORKER_SPEC`.
pub fn main() -> Result<()> {
    let spec: WorkerSpec = serde_json::from_str(
        &std::env::var(SPEC_ENV)
            .with_context(|| format!("{SPEC_ENV} is not set: workers are started by `gpusanity check`"))?,
    )
    .context("malformed worker spec")?;
    let out = Emitter(Arc::new(Mutex::new(std::io::stdout())));
    let beat = out.clone();
    std::thread::spawn(move || loop {
        beat.send(&WorkerMsg::Heartbeat);
        std::thread::sleep(HEARTBEAT_EVERY);
    });
    if let Err(e) = run(&spec, &out) {
        out.send(&WorkerMsg::Fatal { error: format!("{e:#}") });
        return Err(e);
    }
    Ok(())
}

fn run(spec: &WorkerSpec, out: &Emitter) -> Result<()> {
    let place = &spec.place;
    let faults = Faults::from_env();
    // The RDMA ports at the start of the run, before anything of ours moves data: the end of
    // `rdma-ports` compares its own reading with this one.
    let rdma_selected = spec.checks.contains(&gpusanity_common::CheckId::RdmaPorts);
    let baseline = Baseline {
        rdma: (rdma_selected && place.local_rank == 0)
            .then(|| rdma_ports::Snapshot::take(&rdma_ports::root(faults.ib_root()))),
        fleet: spec.fleet_baseline.as_deref().and_then(read_fleet_baseline),
    };
    // On a node of several ranks every request goes to the node's own store: node 0's keys
    // through its relay (one connection per node reaches node 0's store, not one per rank).
    let connect = |addr: &str| StoreClient::connect(addr, Duration::from_secs(60), spec.rdzv_secret.clone());
    let (world, node) = match &spec.node_store_addr {
        Some(addr) => {
            let world = connect(addr).context("connecting to this node's store")?.through_relay();
            (world, Some(connect(addr).context("connecting to this node's store")?))
        }
        None => (connect(&spec.store_addr)?, None),
    };
    let member = Member {
        rank: place.rank,
        node_rank: place.node_rank,
        local_rank: place.local_rank,
        node_sizes: place.node_sizes.clone(),
    };
    let mut store = Rounds::new(world, node, member)?;
    // NVML's load and initialisation (a few hundred ms on a cold node) run beside the CUDA
    // context's and cuBLAS's creation, not after them: the health monitor and the link reading
    // below then find it ready (the library is initialised once per process).
    if spec.device == gpusanity_common::report::DeviceKind::Cuda {
        std::thread::spawn(|| {
            let t = Instant::now();
            let ok = gpusanity_nvml::available();
            tracing::info!(nvml_ms = t.elapsed().as_millis() as u64, ok, "NVML loaded beside the backend's open");
        });
    }
    let opening = Instant::now();
    let mut backend = backend::open(spec.device, place, &mut store)
        .with_context(|| format!("opening the {} backend on local device {}", spec.device, place.local_rank))?;
    tracing::info!(open_ms = opening.elapsed().as_millis() as u64, "backend open");
    let device = backend.device_name();
    let local_gpus = place.node_sizes.get(place.node_rank).copied().unwrap_or(1);
    let link = crate::checks::gpu_health::link(backend.as_ref(), local_gpus);
    out.send(&WorkerMsg::Ready { device: device.clone(), link });
    // Opened before the first check, read by the health check at its turn (docs/health.md).
    let health = crate::checks::gpu_health::watch(backend.as_ref(), &spec.checks);
    if let Some(Err(e)) = &health {
        tracing::warn!("GPU health: {e}");
    }
    let mut earlier_load = None;
    for (i, name) in spec.checks.iter().enumerate() {
        if i == 0 && faults.has("delay-start", place.rank) {
            // Every rank waits for this one at the barrier below: the run lasts 2 s longer,
            // with all workers alive, and nothing else changes.
            std::thread::sleep(Duration::from_secs(2));
        }
        store.barrier_all(&format!("check/{i}"), BARRIER_WAIT)?;
        out.phase(*name, "start", 0);
        if i == 0 && faults.has("exit", place.rank) {
            std::process::exit(17);
        }
        if i == 0 && faults.has("hang", place.rank) {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        let start = Instant::now();
        let mut ctx = CheckCtx {
            backend: backend.as_mut(),
            store: &mut store,
            place,
            configs: &spec.configs,
            progress: out,
            faults: &faults,
            health: health.as_ref(),
            load: &mut earlier_load,
            baseline: &baseline,
            limit: spec.per_test_s.and_then(|s| start.checked_add(Duration::try_from_secs_f64(s).ok()?)),
        };
        let result = crate::checks::remeasure::run(*name, &mut ctx, &device);
        out.send(&WorkerMsg::CheckDone {
            check: *name,
            duration_s: start.elapsed().as_secs_f64(),
            result: Box::new(result),
        });
    }
    Ok(())
}

/// The fleet baseline's file of rank 0's spec, read bounded and validated; a file that cannot
/// be read is a warning (the re-measure then judges without the fleet, the check goes on).
fn read_fleet_baseline(path: &std::path::Path) -> Option<gpusanity_common::fleet::file::BaselineFile> {
    match gpusanity_common::fleet::file::BaselineFile::read(path) {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!("the re-measure judges without the fleet: {e}");
            None
        }
    }
}
