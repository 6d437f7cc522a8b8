//! Starts this node's workers and supervises them from outside: per-test and whole-run
//! deadlines, crashes, a stop from another node or a signal. Returns what this node measured,
//! whatever happened: results of finished checks are never lost.

use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusanity_common::report::{RankInfo, RankResult};
use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

mod unfinished;

use super::node::AbortHandle;
use super::outcome::{NodeOutcome, Stop};
use crate::protocol::{WorkerMsg, WorkerSpec, FAULT_ENV, SPEC_ENV};
use unfinished::{describe_exit, unfinished};

/// How long a node whose rank failed waits for a stop decided elsewhere.
const FAILURE_GRACE: Duration = Duration::from_millis(1000);

/// Lines of a worker's stderr kept for crash attribution.
const TAIL_LINES: usize = 20;

pub struct Supervisor {
    pub node_rank: usize,
    pub hostname: String,
    pub specs: Vec<WorkerSpec>,
    pub check_envs: Vec<(String, String)>,
    /// Whether the workers may see `GPUSANITY_FAULT` (from the launcher's environment or the
    /// job's envs); off, it is removed from theirs.
    pub test_faults: bool,
    pub per_test: Duration,
    /// How long a node may go without progress (or a rank without a heartbeat) before the
    /// running test is stopped as hung.
    pub stall: Duration,
    /// When the whole run must be over.
    pub run_deadline: Instant,
    pub run_limit: Duration,
}

enum Event {
    Msg(usize, WorkerMsg),
    Exited(usize, std::io::Result<ExitStatus>),
}

struct Rank {
    spec: WorkerSpec,
    pid: u32,
    device: String,
    link: Option<gpusanity_common::report::Link>,
    last_beat: Instant,
    progress: Option<(String, String, u64)>,
    progress_seq: u64,
    results: Vec<Option<(f64, RankResult)>>,
    exited: Option<String>,
    /// When it exited (wall clock, to tell across nodes which rank died first).
    exited_at: Option<std::time::SystemTime>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Supervisor {
    /// Runs the workers until every check is done or the run stops. `external` delivers a stop
    /// decided elsewhere (another node, a signal).
    pub async fn run(self, mut external: mpsc::Receiver<Stop>, abort: AbortHandle) -> Result<NodeOutcome> {
        let (tx, mut rx) = mpsc::channel::<Event>(1024);
        let mut ranks = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            ranks.push(self.spawn(i, spec, tx.clone()).await?);
        }
        let nchecks = self.specs.first().map(|s| s.checks.len()).unwrap_or(0);
        let bar = progress_bar(nchecks * ranks.len());
        let mut stages = Stages::new(nchecks);
        let watched = self.watch(&mut ranks, &mut rx, &mut external, &bar, &mut stages).await;
        bar.finish_and_clear();
        let stop = match watched {
            Watched::Done => None,
            Watched::Stopped(stop) => Some(stop),
            Watched::GaveUp(own) => Some(their_stop_or(own, &mut external).await),
        };
        self.tell_other_nodes(stop.as_ref(), abort).await;
        let checks = stages.results(&ranks, stop.as_ref());
        end_workers(&ranks, &mut rx).await;
        Ok(NodeOutcome { node_rank: self.node_rank, ranks: self.rank_infos(&ranks), checks, stop, host: None })
    }

    /// Follows the workers until every check is done on every rank or the run stops: a rank
    /// died or gave up, a deadline passed, the node stalled, another node or a signal said stop.
    async fn watch(
        &self,
        ranks: &mut [Rank],
        rx: &mut mpsc::Receiver<Event>,
        external: &mut mpsc::Receiver<Stop>,
        bar: &ProgressBar,
        stages: &mut Stages,
    ) -> Watched {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            if stages.advance(ranks) {
                return Watched::Done;
            }
            let watched = tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Event::Msg(i, msg)) => self.on_message(&mut ranks[i], msg, bar, stages),
                    Some(Event::Exited(i, status)) => self.on_exit(&mut ranks[i], status).await,
                    None => Some(Watched::Stopped(Stop::Interrupted {
                        node_rank: self.node_rank,
                        signal: "event channel closed".into(),
                    })),
                },
                Some(s) = external.recv() => Some(Watched::Stopped(s)),
                _ = tick.tick() => self.on_tick(ranks, stages).map(Watched::Stopped),
            };
            if let Some(watched) = watched {
                return watched;
            }
        }
    }

    /// A worker's message: its beat, its progress, a check's result; or it gave up.
    fn on_message(&self, r: &mut Rank, msg: WorkerMsg, bar: &ProgressBar, stages: &mut Stages) -> Option<Watched> {
        r.last_beat = Instant::now();
        if !matches!(msg, WorkerMsg::Heartbeat) {
            stages.last_move = r.last_beat;
        }
        match msg {
            WorkerMsg::Heartbeat => {}
            WorkerMsg::Ready { device, link } => {
                r.device = device;
                r.link = link;
            }
            WorkerMsg::Progress { check, phase, step } => {
                // Where each rank is, for a reader of the log while it runs (GPUSANITY_LOG=debug).
                if phase == "start" {
                    tracing::debug!(rank = r.spec.place.rank, %check, "check started");
                }
                bar.set_message(format!("{check}: rank {} {phase} {step}", r.spec.place.rank));
                r.progress_seq += 1;
                r.progress = Some((check.to_string(), phase, step));
            }
            WorkerMsg::CheckDone { check, duration_s, result } => {
                tracing::debug!(rank = r.spec.place.rank, %check, status = ?result.status, "check done");
                if let Some(k) = r.spec.checks.iter().position(|c| *c == check) {
                    r.results[k] = Some((duration_s, *result));
                    bar.inc(1);
                }
            }
            WorkerMsg::Fatal { error } => {
                let rank = r.spec.place.rank;
                return Some(Watched::GaveUp(Stop::RankFailed { node_rank: self.node_rank, rank, reason: error }));
            }
        }
        None
    }

    /// A worker exited: the run stops unless it finished every check and exited cleanly.
    async fn on_exit(&self, r: &mut Rank, status: std::io::Result<ExitStatus>) -> Option<Watched> {
        // Let the stderr reader catch up with the last lines.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let desc = describe_exit(&status);
        r.exited = Some(desc.clone());
        r.exited_at = Some(std::time::SystemTime::now());
        let finished = r.results.iter().all(Option::is_some);
        let ok = matches!(&status, Ok(s) if s.success());
        if finished && ok {
            return None;
        }
        let tail = tail_text(&r.tail);
        let reason = if tail.is_empty() { desc } else { format!("{desc}; last output:\n{tail}") };
        Some(Watched::Stopped(Stop::RankFailed { node_rank: self.node_rank, rank: r.spec.place.rank, reason }))
    }

    /// The clock: the whole run's deadline, a stall, the running test's limit.
    fn on_tick(&self, ranks: &[Rank], stages: &Stages) -> Option<Stop> {
        let now = Instant::now();
        if now >= self.run_deadline {
            return Some(Stop::RunTimeout { node_rank: self.node_rank, limit_s: self.run_limit.as_secs_f64() });
        }
        if let Some(stop) = self.stalled(ranks, stages.stage, now, stages.last_move) {
            return Some(stop);
        }
        (now.duration_since(stages.stage_start) >= self.per_test).then(|| Stop::TestTimeout {
            node_rank: self.node_rank,
            check: self.stage_name(stages.stage),
            limit_s: self.per_test.as_secs_f64(),
        })
    }

    /// What runs in `stage`: the set-up, or a check.
    fn stage_name(&self, stage: usize) -> String {
        if stage == 0 {
            "set-up".to_string()
        } else {
            self.specs[0].checks[stage - 1].to_string()
        }
    }

    /// Tells the other nodes of a stop decided here, before any worker is killed here. (Off the
    /// runtime's thread: node 0's store is served by this same runtime.)
    async fn tell_other_nodes(&self, stop: Option<&Stop>, mut abort: AbortHandle) {
        if let Some(s) = stop.filter(|s| s.node_rank() == self.node_rank).cloned() {
            let _ = tokio::task::spawn_blocking(move || abort.publish(&s)).await;
        }
    }

    /// Who each rank was: its place, device, process and link.
    fn rank_infos(&self, ranks: &[Rank]) -> Vec<RankInfo> {
        ranks
            .iter()
            .map(|r| RankInfo {
                rank: r.spec.place.rank,
                node_rank: self.node_rank,
                local_rank: r.spec.place.local_rank,
                host: self.hostname.clone(),
                device: r.device.clone(),
                pid: r.pid,
                link: r.link,
            })
            .collect()
    }

    /// A stall: a live rank silent (no heartbeat) for the stall time, in any stage; or, once
    /// the checks run, no rank of this node progressing for the stall time (every rank waits,
    /// for one of them or for a rank elsewhere). The diagnosis then names the rank that stopped
    /// beating or made the least progress, as after a per-test overrun; a slow rank that still
    /// progresses keeps the node moving and is never stopped here.
    fn stalled(&self, ranks: &[Rank], stage: usize, now: Instant, last_move: Instant) -> Option<Stop> {
        let check = self.stage_name(stage);
        let stall_s = self.stall.as_secs_f64();
        let silent = ranks.iter().find(|r| r.exited.is_none() && now.duration_since(r.last_beat) >= self.stall);
        if let Some(r) = silent {
            return Some(Stop::Stalled {
                node_rank: self.node_rank,
                check,
                stall_s,
                silent_rank: Some(r.spec.place.rank),
            });
        }
        (stage > 0 && now.duration_since(last_move) >= self.stall).then_some(Stop::Stalled {
            node_rank: self.node_rank,
            check,
            stall_s,
            silent_rank: None,
        })
    }

    /// Starts worker `i` on `spec`; its messages and its exit come through `tx`.
    async fn spawn(&self, i: usize, spec: &WorkerSpec, tx: mpsc::Sender<Event>) -> Result<Rank> {
        let mut child = self.worker_command(spec)?.spawn().context("starting a worker process")?;
        let pid = child.id().unwrap_or(0);
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward_messages(i, out, tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(keep_tail(spec.place.rank, err, tail.clone()));
        }
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send(Event::Exited(i, status)).await;
        });
        Ok(Rank {
            spec: spec.clone(),
            pid,
            device: String::new(),
            link: None,
            last_beat: Instant::now(),
            progress: None,
            progress_seq: 0,
            results: vec![None; spec.checks.len()],
            exited: None,
            exited_at: None,
            tail,
        })
    }

    /// The worker's command: `gpusanity worker` with its spec and the job's envs, killed with
    /// the launcher.
    fn worker_command(&self, spec: &WorkerSpec) -> Result<Command> {
        let exe = std::env::current_exe().context("locating the gpusanity binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg("worker");
        if !self.test_faults {
            // Test hooks never reach a worker unless the operator enabled them.
            cmd.env_remove(FAULT_ENV)
                .env_remove(crate::checks::rdma_ports::IB_ROOT_ENV)
                .env_remove(gpusanity_common::envs::PACE_ENV);
        }
        cmd.env(SPEC_ENV, serde_json::to_string(spec)?)
            // The worker has the secret in its spec; nothing it starts needs it.
            .env_remove(crate::store::auth::SECRET_ENV)
            .envs(self.check_envs.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
        // which is async-signal-safe. It makes the kernel kill the worker if the launcher
        // dies, so a SIGKILLed launcher leaves no orphan.
        unsafe {
            cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
        }
        Ok(cmd)
    }
}

/// Worker `i`'s messages (JSON lines on its stdout), sent on as events.
async fn forward_messages(i: usize, out: tokio::process::ChildStdout, tx: mpsc::Sender<Event>) {
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<WorkerMsg>(&line) {
            Ok(msg) => {
                if tx.send(Event::Msg(i, msg)).await.is_err() {
                    break;
                }
            }
            Err(_) => tracing::warn!(worker = i, "unexpected worker output: {line}"),
        }
    }
}

/// Rank `rank`'s stderr, logged, its last [`TAIL_LINES`] kept for crash attribution.
async fn keep_tail(rank: usize, err: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(rank, "{line}");
        if let Ok(mut t) = tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line);
        }
    }
}

/// How the watch over the workers ended.
enum Watched {
    /// Every check is done on every rank.
    Done,
    /// A rank died, a deadline passed, the node stalled, or another node or a signal said stop.
    Stopped(Stop),
    /// A worker gave up (rather than died): it may only have lost a peer on another node.
    GaveUp(Stop),
}

/// A rank that gave up may only have seen a peer on another node go away: a stop from that
/// node is given a moment to arrive, and preferred.
async fn their_stop_or(own: Stop, external: &mut mpsc::Receiver<Stop>) -> Stop {
    match tokio::time::timeout(FAILURE_GRACE, external.recv()).await {
        Ok(Some(theirs)) => theirs,
        _ => own,
    }
}

/// Where this node's run stands: stage 0 is set-up (the backends opening), stage i+1 check i.
struct Stages {
    nchecks: usize,
    stage: usize,
    stage_start: Instant,
    /// The last sign of progress from any rank of this node (heartbeats do not count).
    last_move: Instant,
    check_start: Vec<Option<Instant>>,
    check_end: Vec<Option<Instant>>,
}

impl Stages {
    fn new(nchecks: usize) -> Stages {
        Stages {
            nchecks,
            stage: 0,
            stage_start: Instant::now(),
            last_move: Instant::now(),
            check_start: vec![None; nchecks],
            check_end: vec![None; nchecks],
        }
    }

    /// Moves past every stage that every rank is done with; true once every check is.
    fn advance(&mut self, ranks: &[Rank]) -> bool {
        let stage_done = |stage: usize| {
            ranks.iter().all(|r| if stage == 0 { !r.device.is_empty() } else { r.results[stage - 1].is_some() })
        };
        while self.stage <= self.nchecks && stage_done(self.stage) {
            if self.stage > 0 {
                self.check_end[self.stage - 1] = Some(Instant::now());
            }
            self.stage += 1;
            self.stage_start = Instant::now();
            self.last_move = self.stage_start;
            if self.stage <= self.nchecks {
                self.check_start[self.stage - 1] = Some(self.stage_start);
            }
        }
        self.stage > self.nchecks
    }

    /// Per check, its duration on this node and every rank's result: where an unfinished rank
    /// was, recorded before anything is killed.
    fn results(&self, ranks: &[Rank], stop: Option<&Stop>) -> Vec<(f64, Vec<RankResult>)> {
        let now = Instant::now();
        (0..self.nchecks)
            .map(|k| {
                let results = ranks
                    .iter()
                    .map(|r| match &r.results[k] {
                        Some((_, res)) => res.clone(),
                        None => unfinished(r, k, self.stage, stop, now),
                    })
                    .collect();
                let dur = match (self.check_start[k], self.check_end[k]) {
                    (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
                    (Some(s), None) => now.duration_since(s).as_secs_f64(),
                    _ => 0.0,
                };
                (dur, results)
            })
            .collect()
    }
}

/// Ends every worker still alive and reaps it: nothing is left behind.
async fn end_workers(ranks: &[Rank], rx: &mut mpsc::Receiver<Event>) {
    for r in ranks.iter().filter(|r| r.exited.is_none()) {
        let _ = kill(Pid::from_raw(r.pid as i32), Signal::SIGKILL);
    }
    let mut alive = ranks.iter().filter(|r| r.exited.is_none()).count();
    while alive > 0 {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(Event::Exited(..))) => alive -= 1,
            Ok(Some(_)) => {}
            _ => break,
        }
    }
}

fn tail_text(tail: &Arc<Mutex<VecDeque<String>>>) -> String {
    tail.lock().map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

fn progress_bar(len: usize) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template("{spinner} checks [{bar:20}] {pos}/{len} {elapsed} {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
