//! The watch while a job runs (docs/watch.md), the agent's half: a [`WatchTask`] from the
//! coordinator starts a sampling thread on the job's GPUs of this node (or renews its lease);
//! an `Unwatch`, the lease running out, or the agent stopping ends it. Each period's summary
//! comes back to the agent's loop on a channel, which signs and publishes it on the telemetry
//! topic. Nothing here touches the job's processes.

mod owners;
pub mod replay;
mod sampler;
mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use gpusanity_common::wire::watch::{Telemetry, WatchTask};
use tokio::sync::mpsc;

use sampler::{Control, Plan};
use source::Source;

struct Watching {
    run_id: String,
    control: Control,
    thread: std::thread::JoinHandle<()>,
}

pub(crate) struct Watches {
    node: String,
    agent_id: String,
    /// Test rigs only: a recording read in place of the GPUs ([`replay`]).
    replay: Option<PathBuf>,
    by_job: HashMap<String, Watching>,
    tx: mpsc::UnboundedSender<Telemetry>,
}

impl Watches {
    pub fn new(node: &str, agent_id: &str, replay: Option<PathBuf>, tx: mpsc::UnboundedSender<Telemetry>) -> Self {
        Watches { node: node.into(), agent_id: agent_id.into(), replay, by_job: HashMap::new(), tx }
    }

    /// Whether `w` renews a watch running for its run.
    pub fn renews(&self, w: &WatchTask) -> bool {
        self.by_job.get(&w.job_id).is_some_and(|x| x.run_id == w.run_id && !x.thread.is_finished())
    }

    /// Starts watching the task's job, or renews the watch of it.
    pub fn watch(&mut self, w: WatchTask) {
        if let Err(e) = w.validate() {
            return tracing::warn!(job_id = w.job_id.escape_debug().to_string(), "watch refused: {e}");
        }
        if w.until <= chrono::Utc::now() {
            return tracing::debug!(job_id = w.job_id, "stale watch ignored (its lease has run out)");
        }
        if let Some(x) = self.by_job.get(&w.job_id) {
            if x.run_id == w.run_id && !x.thread.is_finished() {
                x.control.until_ms.store(w.until.timestamp_millis(), Ordering::Relaxed);
                return;
            }
            self.unwatch(&w.job_id);
        }
        let source: Box<dyn Source> = match self.open(&w) {
            Ok(s) => s,
            Err(e) => return tracing::warn!(job_id = w.job_id, "the watch could not start: {e:#}"),
        };
        let gpus = source.gpus();
        let named: Vec<String> = w.gpu_ids.iter().map(ToString::to_string).collect();
        let control = Control::default();
        control.until_ms.store(w.until.timestamp_millis(), Ordering::Relaxed);
        let plan = Plan {
            job_id: w.job_id.clone(),
            run_id: w.run_id.clone(),
            node: self.node.clone(),
            agent_id: self.agent_id.clone(),
            interval_ms: w.interval_ms,
            period_ms: w.period_ms,
        };
        let (c, tx) = (control.clone(), self.tx.clone());
        let thread = std::thread::Builder::new().name("watch".into()).spawn(move || sampler::run(plan, source, c, tx));
        match thread {
            Ok(thread) => {
                tracing::info!(
                    job_id = w.job_id,
                    run_id = w.run_id,
                    gpus = gpus.len(),
                    named = if named.is_empty() { "every GPU of the node".into() } else { named.join(",") },
                    "watching the job's GPUs"
                );
                self.by_job.insert(w.job_id, Watching { run_id: w.run_id, control, thread });
            }
            Err(e) => tracing::warn!(job_id = w.job_id, "the watch could not start: {e}"),
        }
    }

    fn open(&self, w: &WatchTask) -> anyhow::Result<Box<dyn Source>> {
        Ok(match &self.replay {
            Some(path) => Box::new(replay::Replay::load(path, &w.gpu_ids)?),
            None => Box::new(source::Nvml::open(&w.gpu_ids)?),
        })
    }

    /// Stops watching the job (its thread ends within 100 ms).
    pub fn unwatch(&mut self, job_id: &str) {
        if let Some(x) = self.by_job.remove(job_id) {
            x.control.stop.store(true, Ordering::Relaxed);
            tracing::info!(job_id, run_id = x.run_id, "stopped watching the job's GPUs");
        }
    }

    /// Forgets the watches whose lease ran out.
    pub fn expire(&mut self) {
        let ended: Vec<String> =
            self.by_job.iter().filter(|(_, x)| x.thread.is_finished()).map(|(j, _)| j.clone()).collect();
        for job_id in ended {
            if let Some(x) = self.by_job.remove(&job_id) {
                tracing::info!(job_id, run_id = x.run_id, "stopped watching the job's GPUs: the watch was not renewed");
            }
        }
    }

    pub fn stop_all(&mut self) {
        let jobs: Vec<String> = self.by_job.keys().cloned().collect();
        for j in jobs {
            self.unwatch(&j);
        }
    }
}

/// What [`record`] measured of itself.
#[derive(Debug, Clone, Copy)]
pub struct RecordCost {
    pub summaries: usize,
    pub wall_s: f64,
    /// User and system CPU time of this process.
    pub cpu_s: f64,
}

/// Samples this node's GPUs `ids` (every GPU for none) as a watch does for `seconds`, writing
/// each period's summary to `out` as a JSON line (`gpusanity watch-record`): a recording of a
/// job's telemetry, and the sampler's own cost.
pub fn record(
    ids: &[gpusanity_common::wire::gpu_id::GpuId],
    interval_ms: u32,
    period_ms: u32,
    seconds: f64,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<RecordCost> {
    let task = WatchTask {
        job_id: "watch-record".into(),
        run_id: "watch-record".into(),
        gpu_ids: ids.to_vec(),
        interval_ms,
        period_ms,
        until: chrono::Utc::now() + chrono::Duration::milliseconds((seconds * 1000.0) as i64),
    };
    task.validate()?;
    let source = source::Nvml::open(ids)?;
    let control = Control::default();
    control.until_ms.store(task.until.timestamp_millis(), Ordering::Relaxed);
    let plan = Plan {
        job_id: task.job_id.clone(),
        run_id: task.run_id.clone(),
        node: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
        agent_id: "watch-record".into(),
        interval_ms,
        period_ms,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = std::time::Instant::now();
    let cpu0 = cpu_s();
    let thread = std::thread::spawn(move || sampler::run(plan, Box::new(source), control, tx));
    let mut summaries = 0;
    while let Some(t) = rx.blocking_recv() {
        writeln!(out, "{}", serde_json::to_string(&t)?)?;
        out.flush()?;
        summaries += 1;
    }
    let _ = thread.join();
    Ok(RecordCost { summaries, wall_s: started.elapsed().as_secs_f64(), cpu_s: cpu_s() - cpu0 })
}

fn cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}
