//! The node launcher of `gpusanity check`: timing policy, device and topology resolution,
//! rendezvous, workers under supervision, node 0's report and verdict, and the hand-over.

pub mod arrival;
mod compact;
mod events;
mod fit;
mod fleet_file;
pub mod gather;
mod host;
pub mod node;
pub(crate) mod not_ready;
pub mod outcome;
mod readiness;
pub mod rendezvous;
mod report_files;
pub(crate) mod sent;
pub mod supervise;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusanity_common::config::CheckConfigs;
pub use gpusanity_common::device::DeviceChoice;
use gpusanity_common::events::CheckState;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{DeviceKind, Finding, RunStatus};
use gpusanity_common::timing;
use gpusanity_common::{ExitCode, Settings, TimeoutOps};
use thiserror::Error;
use tokio::sync::mpsc;

use crate::backend::WorkerPlace;
use crate::protocol::WorkerSpec;
use events::EventLog;
use node::{Cluster, Joined, Offer, RunEnd};
use outcome::{NodeOutcome, Stop};
use rendezvous::TopologyFlags;
use report_files::rewrite_events;
pub use report_files::{write_html, write_report};
use supervise::Supervisor;

/// Bad input: reported as one line, exit code 2.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Everything `gpusanity check` was asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub topology: TopologyFlags,
    pub nproc_per_node: Option<usize>,
    pub device: DeviceChoice,
    pub settings: Settings,
    /// `EnableSanityCheck`.
    pub enabled: bool,
    /// How many times the job has been restarted (0 on its first start).
    pub restart_count: u64,
    pub check_params: Vec<String>,
    pub report_dir: PathBuf,
    /// How long to wait for the other nodes at the rendezvous.
    pub rdzv_timeout: Duration,
    pub command: Vec<String>,
    /// This node's name in the report (the agent passes the job's node name); else the hostname.
    pub node_name: Option<String>,
    /// The run's rendezvous secret (`--rdzv-secret-file` or `GPUSANITY_RDZV_SECRET`).
    pub rdzv_secret: Option<crate::store::Secret>,
    /// Which variables `--sanity-check-envs` may set, and whether test faults pass.
    pub env_policy: gpusanity_common::envs::EnvPolicy,
    /// The fleet baseline node 0 judges every headline figure against (`--baseline FILE`).
    pub baseline: Option<std::sync::Arc<gpusanity_common::fleet::file::BaselineFile>>,
}

/// What the process does once the check is over.
#[derive(Debug)]
pub enum Handover {
    /// Replace this process with COMMAND.
    Exec(Vec<String>),
    Exit(ExitCode),
}

/// How `gpusanity check` ended on this node: the hand-over, and on node 0 the report it wrote
/// (for actions on the verdict, such as draining faulty nodes through Slurm).
#[derive(Debug)]
pub struct Finished {
    pub handover: Handover,
    pub report: Option<gpusanity_common::report::Report>,
}

impl From<Handover> for Finished {
    fn from(handover: Handover) -> Finished {
        Finished { handover, report: None }
    }
}

/// The launcher's environment, as a map.
type Env = std::collections::HashMap<String, String>;

/// Runs `gpusanity check` on this node.
pub async fn check(opts: CheckOptions) -> Result<Finished> {
    let started = Instant::now();
    let env: Env = std::env::vars().collect();
    let topo = rendezvous::resolve(&opts.topology, &env).map_err(|e| UsageError(e.to_string()))?;
    let is_master = topo.node_rank == 0;
    opts.env_policy.check(&opts.settings.envs).map_err(|e| UsageError(e.to_string()))?;
    if let Some(reason) = skip_reason(&opts) {
        return skip(&opts, is_master, reason);
    }
    let host = this_host(&opts);
    let (offer, configs) = match make_offer(&opts, &env, &topo, &host)? {
        ControlFlow::Continue(made) => made,
        ControlFlow::Break(finished) => return Ok(finished),
    };
    let (device, nproc) = (offer.device, offer.nproc);
    let host_read = match offer.not_ready.is_empty() {
        true => host::read(device, nproc, &configs, (topo.node_rank, &host), opts.env_policy.test_faults),
        false => None,
    };
    let (cluster, mut log) = match meet(&opts, &topo, &host, &configs, offer, started).await? {
        ControlFlow::Continue(met) => met,
        ControlFlow::Break(finished) => return Ok(finished),
    };
    let checks =
        crate::checks::pair_schedule::with_link_test(opts.settings.selected_checks(), device, cluster.sizes.len());
    log_checking(&mut log, device, &cluster, &checks)?;
    let meta = run_meta(&opts, &cluster, device, &configs, checks);
    // This node's own store, where its ranks meet before their node speaks for them in node 0's
    // (store::Rounds); served until the run ends.
    let node_store = start_node_store(&cluster, nproc)?;
    let mut outcome = run_workers(&opts, &topo, &cluster, &meta, nproc, node_store.as_ref(), started).await?;
    outcome.host = host_read;
    if let Err(e) = cluster.post_outcome(&outcome).await {
        // Cut off from node 0 (its link is down, or node 0 is gone): nobody will hear us.
        eprintln!("gpusanity: node {} cannot reach the rendezvous store: {e:#}; its results are lost", topo.node_rank);
        return Ok(Handover::Exit(ExitCode::CheckFailed).into());
    }
    let (verdict, written) = match is_master {
        true => {
            let (verdict, report) = report_and_publish(&opts, &cluster, &meta, outcome, &mut log).await?;
            (verdict, Some(report))
        }
        false => (cluster.await_verdict(opts.settings.max_time() + Duration::from_secs(60)).await?, None),
    };
    let handover = hand_over(&opts, &verdict, &mut log, is_master).await?;
    Ok(Finished { handover, report: written })
}

/// The check is skipped (`reason`): logged, and the job's command runs.
fn skip(opts: &CheckOptions, is_master: bool, reason: String) -> Result<Finished> {
    let mut log = EventLog::new(is_master.then_some(opts.report_dir.as_path()))?;
    log.push(CheckState::CheckSkipped, reason)?;
    finish_pass(opts, &mut log).map(Finished::from)
}

/// This node's name in the report: the one it was given, else its hostname.
fn this_host(opts: &CheckOptions) -> String {
    opts.node_name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
    })
}

/// What this node brings to the rendezvous, and the checks' configuration; or, on a node alone
/// that cannot run the job's GPUs, the end of the check (its report written).
fn make_offer(
    opts: &CheckOptions,
    env: &Env,
    topo: &rendezvous::Topology,
    host: &str,
) -> Result<ControlFlow<Finished, (Offer, CheckConfigs)>> {
    let fault = inherited_fault(opts, env);
    match resolve_device(opts, env, topo.node_rank, host)? {
        Ok((device, nproc, devices)) => {
            let mut configs = CheckConfigs::defaults(device);
            configs.apply_params(&opts.check_params).map_err(|e| UsageError(e.to_string()))?;
            fit::check_fits(&configs, &opts.settings.selected_checks(), device, nproc)?;
            Ok(ControlFlow::Continue((Offer { device, nproc, devices, not_ready: Vec::new(), fault }, configs)))
        }
        Err((configs, findings)) if topo.nnodes == 1 => {
            readiness::fail(opts, topo.node_rank, host, &configs, findings).map(ControlFlow::Break)
        }
        // Node 0 names this node with its evidence once every node has arrived.
        Err((configs, findings)) => {
            let offer = Offer { device: DeviceKind::Cuda, nproc: 0, devices: Vec::new(), not_ready: findings, fault };
            Ok(ControlFlow::Continue((offer, configs)))
        }
    }
}

/// The rendezvous: the cluster every node arrived at, ready, with node 0's event log; or the end
/// of the check, where some node never arrived or cannot run the job's GPUs.
async fn meet(
    opts: &CheckOptions,
    topo: &rendezvous::Topology,
    host: &str,
    configs: &CheckConfigs,
    offer: Offer,
    started: Instant,
) -> Result<ControlFlow<Finished, (Cluster, EventLog)>> {
    let is_master = topo.node_rank == 0;
    let (device, own_findings) = (offer.device, offer.not_ready.clone());
    // A node that never arrives is named within the run's own limit, not after a longer wait.
    let rdzv_wait = opts.rdzv_timeout.min(opts.settings.max_time().saturating_sub(started.elapsed()));
    warn_if_unauthenticated(opts, topo);
    let secret = opts.rdzv_secret.clone();
    let joined = match Cluster::join(topo, opts.node_name.as_deref(), offer, rdzv_wait, secret).await {
        Ok(joined) => joined,
        // Not ready and no rendezvous either: say why here, as a node alone would.
        Err(e) if !own_findings.is_empty() => {
            tracing::warn!("rendezvous of a node that is not ready: {e:#}");
            return readiness::fail(opts, topo.node_rank, host, configs, own_findings).map(ControlFlow::Break);
        }
        Err(e) => return Err(e),
    };
    let mut log = EventLog::new(is_master.then_some(opts.report_dir.as_path()))?;
    match joined {
        Joined::All(cluster) => Ok(ControlFlow::Continue((cluster, log))),
        Joined::Missing(m) => missing_nodes(opts, is_master, device, configs, &mut log, m).map(ControlFlow::Break),
        Joined::NotReady(cluster, findings, summary) => {
            not_ready::conclude(opts, &cluster, device, configs, findings, &summary).await.map(ControlFlow::Break)
        }
    }
}

fn warn_if_unauthenticated(opts: &CheckOptions, topo: &rendezvous::Topology) {
    if topo.nnodes > 1 && opts.rdzv_secret.is_none() {
        tracing::warn!(
            "the rendezvous of this {}-node run is unauthenticated: anyone who reaches node 0's port can forge \
             results or verdicts; give every node the same --rdzv-secret-file or {} (docs/security.md)",
            topo.nnodes,
            crate::store::auth::SECRET_ENV
        );
    }
}

/// The run as its report states it, starting now: its `checks`, their configuration, and the
/// settings with any inherited test fault.
fn run_meta(
    opts: &CheckOptions,
    cluster: &Cluster,
    device: DeviceKind,
    configs: &CheckConfigs,
    checks: Vec<CheckId>,
) -> gather::RunMeta {
    gather::RunMeta {
        run_id: cluster.run_id.clone(),
        started_at: chrono::Utc::now(),
        settings: with_inherited_fault(opts, cluster),
        backend: device,
        configs: configs.clone(),
        checks,
    }
}

fn log_checking(log: &mut EventLog, device: DeviceKind, cluster: &Cluster, checks: &[CheckId]) -> Result<()> {
    let names: Vec<&str> = checks.iter().map(|c| c.as_str()).collect();
    log.push(CheckState::Checking, format!("{} on {} rank(s): {}", device, cluster.world, names.join(", ")))
}

/// The store this node's ranks meet in (store::Rounds); a node of one rank needs none.
fn start_node_store(cluster: &Cluster, nproc: usize) -> Result<Option<crate::store::NodeStore>> {
    match nproc {
        0 | 1 => Ok(None),
        _ => crate::store::NodeStore::start(cluster.secret.clone(), nproc, &cluster.store_addr)
            .map(Some)
            .context("hosting this node's store"),
    }
}

/// This node's workers, run under supervision until every check is done or the run stops (a
/// stop from another node, a signal): what this node measured.
async fn run_workers(
    opts: &CheckOptions,
    topo: &rendezvous::Topology,
    cluster: &Cluster,
    meta: &gather::RunMeta,
    nproc: usize,
    node_store: Option<&crate::store::NodeStore>,
    started: Instant,
) -> Result<NodeOutcome> {
    // Rank 0 judges the first measurements against the fleet too, before a re-measure: it alone
    // gets the baseline's entries of the run's checks, in a private file removed once the
    // workers are done.
    let fleet_file = match opts.baseline.as_deref() {
        Some(b) if topo.node_rank == 0 && cluster.rank_offset == 0 && nproc > 0 => fleet_file::write(b, &meta.checks),
        _ => None,
    };
    let place = WorkerStores { node_store: node_store.map(|s| s.addr()), fleet_file: fleet_file.as_ref() };
    let specs = worker_specs(opts, topo.node_rank, cluster, meta, nproc, place);
    let (stop_tx, stop_rx) = mpsc::channel::<Stop>(8);
    cluster.watch_abort(stop_tx.clone()).await?;
    watch_signals(topo.node_rank, stop_tx.clone());
    let sup = Supervisor {
        node_rank: topo.node_rank,
        hostname: cluster.hostname.clone(),
        specs,
        check_envs: opts.settings.envs.clone(),
        test_faults: opts.env_policy.test_faults,
        per_test: opts.settings.timeout_per_test(),
        stall: Duration::from_secs(meta.configs.stall_s),
        run_deadline: started + opts.settings.max_time(),
        run_limit: opts.settings.max_time(),
    };
    let outcome = sup.run(stop_rx, cluster.abort_handle().await?).await;
    drop((stop_tx, fleet_file));
    outcome
}

/// What the workers find beside their spec: the node's store, and rank 0's fleet file.
struct WorkerStores<'a> {
    node_store: Option<&'a str>,
    fleet_file: Option<&'a fleet_file::FleetFile>,
}

/// Each local rank's spec.
fn worker_specs(
    opts: &CheckOptions,
    node_rank: usize,
    cluster: &Cluster,
    meta: &gather::RunMeta,
    nproc: usize,
    stores: WorkerStores<'_>,
) -> Vec<WorkerSpec> {
    (0..nproc)
        .map(|local| WorkerSpec {
            place: WorkerPlace {
                rank: cluster.rank_offset + local,
                world: cluster.world,
                local_rank: local,
                node_rank,
                node_addr: cluster.node_addr.clone(),
                node_sizes: cluster.sizes.clone(),
            },
            store_addr: cluster.store_addr.clone(),
            rdzv_secret: cluster.secret.clone(),
            device: meta.backend,
            checks: meta.checks.clone(),
            configs: meta.configs.clone(),
            node_store_addr: stores.node_store.map(str::to_string),
            fleet_baseline: stores.fleet_file.filter(|_| cluster.rank_offset + local == 0).map(|f| f.path().into()),
            per_test_s: Some(opts.settings.timeout_per_test().as_secs_f64()),
        })
        .collect()
}

/// Node 0: every node's outcome gathered into the report, which is written and printed, and the
/// verdict published to every node.
async fn report_and_publish(
    opts: &CheckOptions,
    cluster: &Cluster,
    meta: &gather::RunMeta,
    own: NodeOutcome,
    log: &mut EventLog,
) -> Result<(RunEnd, gpusanity_common::report::Report)> {
    let wait = opts.settings.timeout_per_test().min(Duration::from_secs(600)) + Duration::from_secs(30);
    let outcomes = cluster.gather(own, wait).await;
    let mut report = gather::build_report(meta, &cluster.nodes, &outcomes, opts.baseline.as_deref());
    let hold = report.status == RunStatus::TimedOut && opts.settings.timeout_ops == TimeoutOps::KeepJobHang;
    if !hold {
        let state = if report.status == RunStatus::Passed { CheckState::CheckPassed } else { CheckState::CheckFailed };
        log.push(state, report.summary.clone())?;
    }
    report.events = log.events.clone();
    write_report(&opts.report_dir, &report)?;
    print!("{}", gpusanity_reports::text::summary(&report));
    let verdict = RunEnd { status: report.status, summary: report.summary.clone(), hold };
    cluster.publish_verdict(&verdict).await;
    if let Some(peak) = cluster.store_peak_connections() {
        tracing::info!(
            nodes = cluster.sizes.len(),
            ranks = cluster.world,
            peak_connections = peak,
            "node 0's store: the most connections held at once"
        );
    }
    Ok((verdict, report))
}

/// What the process does on the verdict: the job's command on a pass, an exit code otherwise;
/// a KeepJobHang hold first waits for SIGTERM.
async fn hand_over(opts: &CheckOptions, verdict: &RunEnd, log: &mut EventLog, is_master: bool) -> Result<Handover> {
    Ok(match verdict.status {
        RunStatus::Passed | RunStatus::Skipped => finish_pass(opts, log)?,
        RunStatus::Failed => Handover::Exit(ExitCode::CheckFailed),
        RunStatus::TimedOut if verdict.hold => {
            eprintln!("gpusanity: a test overran and --sanity-check-timeout-ops=KeepJobHang: staying in Checking until SIGTERM (report written)");
            wait_for_sigterm().await;
            log.push(CheckState::CheckFailed, "KeepJobHang hold ended by SIGTERM")?;
            if is_master {
                rewrite_events(&opts.report_dir, log)?;
            }
            Handover::Exit(ExitCode::TimedOut)
        }
        RunStatus::TimedOut => Handover::Exit(ExitCode::TimedOut),
    })
}

/// Some nodes never arrived: node 0 writes a report naming them and fails the run; every node
/// that did arrive shares that verdict (exit 1), and none of them starts a check.
fn missing_nodes(
    opts: &CheckOptions,
    is_master: bool,
    device: DeviceKind,
    configs: &CheckConfigs,
    log: &mut EventLog,
    m: node::MissingNodes,
) -> Result<Finished> {
    let names: Vec<String> = m.missing.iter().map(|k| k.to_string()).collect();
    if !is_master {
        eprintln!(
            "gpusanity: node(s) {} never arrived at the rendezvous; node 0 fails the run (CheckFailed)",
            names.join(", ")
        );
        return Ok(Handover::Exit(ExitCode::CheckFailed).into());
    }
    let checks = opts.settings.selected_checks();
    log.push(CheckState::Checking, format!("{device}: waiting for {} node(s)", m.nodes.len()))?;
    let meta = gather::RunMeta {
        run_id: m.run_id.clone(),
        started_at: chrono::Utc::now(),
        settings: opts.settings.clone(),
        backend: device,
        configs: configs.clone(),
        checks,
    };
    let mut report = gather::missing_report(&meta, &m.nodes, &m.missing, m.waited, m.not_ready);
    log.push(CheckState::CheckFailed, report.summary.clone())?;
    report.events = log.events.clone();
    write_report(&opts.report_dir, &report)?;
    print!("{}", gpusanity_reports::text::summary(&report));
    Ok(Finished { handover: Handover::Exit(ExitCode::CheckFailed), report: Some(report) })
}

/// With `--test-faults`, a `GPUSANITY_FAULT` of the launcher's own environment: its workers
/// inject it as they would the job's (unless the job sets its own).
fn inherited_fault(opts: &CheckOptions, env: &Env) -> Option<String> {
    let fault = crate::protocol::FAULT_ENV;
    if !opts.env_policy.test_faults || opts.settings.envs.iter().any(|(k, _)| k == fault) {
        return None;
    }
    env.get(fault).filter(|v| !v.is_empty()).cloned()
}

/// The run's settings as the report states them: a test fault any node's launcher inherited
/// (this node's, or another's from its registration: node 0 reports) is named among the envs,
/// `NODE:FAULT` for another node's, so that no fleet baseline learns from the run.
fn with_inherited_fault(opts: &CheckOptions, cluster: &Cluster) -> Settings {
    let mut settings = opts.settings.clone();
    let fault = crate::protocol::FAULT_ENV;
    if !settings.envs.iter().any(|(k, _)| k == fault) {
        let named: Vec<String> = cluster
            .faults
            .iter()
            .map(|(k, v)| if *k == cluster.node_rank { v.clone() } else { format!("node{k}:{v}") })
            .collect();
        if !named.is_empty() {
            settings.envs.push((fault.to_string(), named.join(";")));
        }
    }
    settings
}

fn skip_reason(opts: &CheckOptions) -> Option<String> {
    if !opts.enabled {
        return Some("EnableSanityCheck is off".into());
    }
    match timing::decide(opts.settings.timing, &timing::Start::from_restart_count(opts.restart_count)) {
        timing::Decision::Run => None,
        timing::Decision::Skip(reason) => Some(reason),
    }
}

/// A pass (or a skip): CheckPassed was logged by the caller; now Running and COMMAND.
fn finish_pass(opts: &CheckOptions, log: &mut EventLog) -> Result<Handover> {
    if opts.command.is_empty() {
        return Ok(Handover::Exit(ExitCode::Passed));
    }
    log.push(CheckState::Running, opts.command.join(" "))?;
    Ok(Handover::Exec(opts.command.clone()))
}

/// The backend, its worker count and devices; or, where the node cannot run the job's GPUs,
/// the configuration and the findings its report holds (readiness.rs).
type Resolution = std::result::Result<(DeviceKind, usize, Vec<String>), (CheckConfigs, Vec<Finding>)>;

fn resolve_device(opts: &CheckOptions, env: &Env, node_rank: usize, host: &str) -> Result<Resolution> {
    if opts.nproc_per_node == Some(0) {
        return Err(UsageError("--nproc-per-node must be at least 1".into()).into());
    }
    let mut gpu_configs = CheckConfigs::defaults(DeviceKind::Cuda);
    gpu_configs.apply_params(&opts.check_params).map_err(|e| UsageError(e.to_string()))?;
    let asked = readiness::asked_gpus(opts.nproc_per_node, gpu_configs.gpu_health.expected_gpus, env);
    let at = readiness::Place { node_rank, host, env };
    match readiness::resolve(opts.device, readiness::Probe::this_node, asked.as_ref(), &at) {
        readiness::Resolved::NotReady(mut findings) => {
            findings.extend(host::driver_too_old(&gpu_configs, (node_rank, host), opts.env_policy.test_faults));
            Ok(Err((gpu_configs, findings)))
        }
        readiness::Resolved::Cuda(names) => {
            Ok(Ok((DeviceKind::Cuda, opts.nproc_per_node.unwrap_or(names.len()), names)))
        }
        readiness::Resolved::Cpu(why) => {
            if opts.device != DeviceChoice::Cpu {
                eprintln!("gpusanity: {why}");
            }
            let nproc = match opts.nproc_per_node {
                Some(n) if n > max_cpu_workers() => {
                    return Err(UsageError(format!(
                    "--nproc-per-node {n} asks for more CPU workers than this node can run ({} at most: {} per core)",
                    max_cpu_workers(),
                    CPU_WORKERS_PER_CORE
                ))
                    .into())
                }
                Some(n) => n,
                None => 2,
            };
            Ok(Ok((DeviceKind::Cpu, nproc, Vec::new())))
        }
    }
}

/// CPU workers share the host's cores; beyond a few per core every check only waits for its
/// turn and the deadlines, not the node, decide the verdict.
const CPU_WORKERS_PER_CORE: usize = 4;

fn max_cpu_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from).saturating_mul(CPU_WORKERS_PER_CORE)
}

fn watch_signals(node_rank: usize, tx: mpsc::Sender<Stop>) {
    use tokio::signal::unix::{signal, SignalKind};
    for (kind, name) in [(SignalKind::terminate(), "SIGTERM"), (SignalKind::interrupt(), "SIGINT")] {
        let tx = tx.clone();
        if let Ok(mut s) = signal(kind) {
            tokio::spawn(async move {
                if s.recv().await.is_some() {
                    let _ = tx.send(Stop::Interrupted { node_rank, signal: name.into() }).await;
                }
            });
        }
    }
}

async fn wait_for_sigterm() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}
