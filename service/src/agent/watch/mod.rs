//! The watch while a job runs (docs/watch.md), the agent's half: a [`WatchTask`] from the
//! coordinator starts a sampling thread on the job's GPUs of this node (or renews its lease);
//! an `Unwatch`, the lease running out, or the agent stopping ends it. Each period's summary
//! comes back to the agent's loop on a channel, which signs and publishes it on the telemetry
//! topic. Nothing here touches the job's processes.

mod owners;
pub mod replay;
mod sampler;
mod source;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use gpusanity_common::wire::watch::{id_in_bounds, Telemetry, WatchTask};
use tokio::sync::mpsc;

use sampler::{Control, Plan};
use source::Source;

/// How many unwatched runs are remembered (a run's late `Watch` arrives within a renewal or
/// two of its `Unwatch`; a node runs a handful of jobs at a time).
const UNWATCHED: usize = 256;

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
    /// The (job, run) pairs an `Unwatch` ended, newest last: never watched again.
    unwatched: VecDeque<(String, String)>,
    tx: mpsc::UnboundedSender<Telemetry>,
}

impl Watches {
    pub fn new(node: &str, agent_id: &str, replay: Option<PathBuf>, tx: mpsc::UnboundedSender<Telemetry>) -> Self {
        Watches {
            node: node.into(),
            agent_id: agent_id.into(),
            replay,
            by_job: HashMap::new(),
            unwatched: VecDeque::new(),
            tx,
        }
    }

    /// Whether an `Unwatch` ended `w`'s run: a `Watch` of it sent before that (a renewal by
    /// another replica, late on the topic) must not start it again.
    pub fn was_unwatched(&self, w: &WatchTask) -> bool {
        self.unwatched.iter().any(|(j, r)| *j == w.job_id && *r == w.run_id)
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
        if self.was_unwatched(&w) {
            return tracing::debug!(job_id = w.job_id, run_id = w.run_id, "watch of a run already unwatched ignored");
        }
        if let Some(x) = self.by_job.get(&w.job_id) {
            if x.run_id == w.run_id && !x.thread.is_finished() {
                x.control.until_ms.store(w.until.timestamp_millis(), Ordering::Relaxed);
                return;
            }
            self.stop(&w.job_id);
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

    /// Stops watching the job's run `run_id` for good (any run of the job when `run_id` is
    /// empty, and nothing is remembered). A watch of another run of the job goes on: the
    /// service starts a restarted job's new run before it ends the old one.
    pub fn unwatch(&mut self, job_id: &str, run_id: &str) {
        // Ids out of bounds are not remembered: no watch that names them is accepted anyway.
        if id_in_bounds(job_id) && id_in_bounds(run_id) {
            if self.unwatched.len() == UNWATCHED {
                self.unwatched.pop_front();
            }
            self.unwatched.push_back((job_id.to_string(), run_id.to_string()));
        }
        if self.by_job.get(job_id).is_some_and(|x| run_id.is_empty() || x.run_id == run_id) {
            self.stop(job_id);
        }
    }

    /// Stops watching the job (its thread ends within 100 ms).
    fn stop(&mut self, job_id: &str) {
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
            self.stop(&j);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Watches of node `n` reading a one-GPU recording (the replay of test rigs), with what
    /// must outlive them: the recording's folder and the summaries' receiver.
    struct Rig {
        w: Watches,
        _dir: tempfile::TempDir,
        _rx: mpsc::UnboundedReceiver<Telemetry>,
    }

    fn rig() -> Rig {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("replay.jsonl");
        std::fs::write(&path, r#"{"s":0,"gpu":"GPU-0","sm_mhz":1980,"power_w":650,"util":100,"limit_w":700}"#)
            .expect("recording");
        let (tx, rx) = mpsc::unbounded_channel();
        Rig { w: Watches::new("n", "agent", Some(path), tx), _dir: dir, _rx: rx }
    }

    fn task(run: &str) -> WatchTask {
        WatchTask {
            job_id: "job".into(),
            run_id: run.into(),
            gpu_ids: Vec::new(),
            interval_ms: 1000,
            period_ms: 5000,
            until: chrono::Utc::now() + chrono::Duration::seconds(60),
        }
    }

    fn watched_run(w: &Watches) -> Option<&str> {
        w.by_job.get("job").map(|x| x.run_id.as_str())
    }

    #[test]
    fn a_watch_that_arrives_after_its_runs_unwatch_does_not_start_it_again() {
        let mut rig = rig();
        let w = &mut rig.w;
        w.watch(task("run-1"));
        assert_eq!(watched_run(w), Some("run-1"));
        w.unwatch("job", "run-1");
        assert_eq!(watched_run(w), None);
        // Another replica's renewal, sent before the Unwatch, read after it.
        w.watch(task("run-1"));
        assert_eq!(watched_run(w), None, "an unwatched run was watched again");
        // The job's next run is watched.
        w.watch(task("run-2"));
        assert_eq!(watched_run(w), Some("run-2"));
        w.stop_all();
    }

    #[test]
    fn ending_a_restarted_jobs_old_run_leaves_its_new_run_watched() {
        let mut rig = rig();
        let w = &mut rig.w;
        w.watch(task("run-1"));
        // The service starts the new run's watch, then ends the old run's.
        w.watch(task("run-2"));
        w.unwatch("job", "run-1");
        assert_eq!(watched_run(w), Some("run-2"));
        assert!(w.renews(&task("run-2")));
        // An Unwatch of an older service names no run: whatever run is watched stops, and a
        // later watch of it is not refused.
        w.unwatch("job", "");
        assert_eq!(watched_run(w), None);
        w.watch(task("run-2"));
        assert_eq!(watched_run(w), Some("run-2"));
        w.stop_all();
    }

    #[test]
    fn the_unwatched_runs_remembered_are_bounded() {
        let mut rig = rig();
        let w = &mut rig.w;
        for i in 0..UNWATCHED + 10 {
            w.unwatch("job", &format!("run-{i}"));
        }
        assert_eq!(w.unwatched.len(), UNWATCHED);
        assert!(!w.was_unwatched(&task("run-0")), "the oldest is forgotten");
        assert!(w.was_unwatched(&task(&format!("run-{}", UNWATCHED + 9))));
        // An id past the wire's bound is not kept (no watch naming it is accepted).
        w.unwatch("job", &"r".repeat(100_000));
        assert!(w.was_unwatched(&task(&format!("run-{}", UNWATCHED + 9))));
        assert!(w.unwatched.iter().all(|(j, r)| j.len() <= 256 && r.len() <= 256));
    }
}
