//! Helpers for the integration tests: run the real `gpusanity` binary with a deadline, read its
//! report, and make sure nothing it started is left running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Check runs share two cores; one at a time keeps timings meaningful.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `gpusanity` binary that cargo built for the integration tests: the one cargo names in
/// CARGO_BIN_EXE_gpusanity while it runs them, else the one beside the running test binary's
/// `deps/` folder (`target/PROFILE/gpusanity`, with `--release` too).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(b) = std::env::var_os("CARGO_BIN_EXE_gpusanity") {
            return b.to_string_lossy().into_owned();
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut dir = exe.parent().expect("the test binary's folder");
        if dir.file_name().is_some_and(|n| n == "deps") {
            dir = dir.parent().expect("the folder above deps/");
        }
        let bin = dir.join("gpusanity");
        assert!(bin.is_file(), "no gpusanity binary at {} (cargo test builds it)", bin.display());
        bin.to_string_lossy().into_owned()
    })
}

/// A fresh report directory and a tag that marks every process of this test.
pub struct Run {
    pub dir: tempfile::TempDir,
    pub tag: String,
}

impl Default for Run {
    fn default() -> Run {
        Run::new()
    }
}

impl Run {
    pub fn new() -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let tag = format!("t{}", dir.path().file_name().unwrap().to_string_lossy().replace('.', ""));
        Run { dir, tag }
    }

    pub fn report_dir(&self) -> PathBuf {
        self.dir.path().join("report")
    }

    /// `gpusanity check` on CPU with this run's report dir; the launcher's environment carries
    /// the run's tag, and its workers inherit it.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("check").arg("--device").arg("cpu").arg("--report-dir").arg(self.report_dir());
        c.args(args).env("GPUSANITY_TEST_TAG", &self.tag);
        c.env_remove("SANITY_CHECK_ARGS").env_remove("ENABLE_SANITY_CHECK").env_remove("TORCHELASTIC_RESTART_COUNT");
        c.env_remove("GPUSANITY_RESTART_COUNT").env_remove("WORLD_SIZE").env_remove("RANK").env_remove("MASTER_ADDR");
        c.env_remove("MASTER_PORT")
            .env_remove("SLURM_NNODES")
            .env_remove("SLURM_NODEID")
            .env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURMD_NODENAME")
            .env_remove("GPUSANITY_RDZV_SECRET");
        c.stdin(Stdio::null());
        c
    }

    /// One node of a `nnodes`-node job on loopback, one worker, with piped output.
    pub fn spawn_node(&self, extra: &[&str], nnodes: usize, node_rank: usize, port: u16) -> Child {
        let (n, r, p) = (nnodes.to_string(), node_rank.to_string(), port.to_string());
        let mut args: Vec<&str> = extra.to_vec();
        args.extend([
            "--nnodes",
            &n,
            "--node-rank",
            &r,
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &p,
        ]);
        let mut c = self.command(&args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().expect("spawn gpusanity")
    }

    pub fn report(&self) -> Value {
        read_json(&self.report_dir().join("report.json"))
    }

    pub fn events(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.report_dir().join("events.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("event line")["state"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// Asserts that no process carrying this run's tag is alive.
    pub fn assert_nothing_left(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = tagged_processes(&self.tag);
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "processes left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

/// Runs `cmd` to completion, killing it after `limit`.
pub fn run_with_timeout(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn gpusanity");
    wait_output(child, limit)
}

pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "gpusanity did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Pids of processes whose environment holds `GPUSANITY_TEST_TAG=tag`, with their rank if they
/// are workers.
pub fn tagged_processes(tag: &str) -> Vec<(i32, Option<u64>)> {
    let needle = format!("GPUSANITY_TEST_TAG={tag}");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let vars: Vec<String> = env.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
        if !vars.contains(&needle) {
            continue;
        }
        // Zombies are gone for our purposes once reaped; skip those already dead.
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z')) {
                continue;
            }
        }
        let rank = vars
            .iter()
            .find_map(|v| v.strip_prefix("GPUSANITY_WORKER_SPEC="))
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .and_then(|v| v["rank"].as_u64());
        found.push((pid, rank));
    }
    found
}

/// Waits until the worker of `rank` carrying `tag` exists, and returns its pid.
pub fn find_worker(tag: &str, rank: u64, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some((pid, _)) = tagged_processes(tag).into_iter().find(|(_, r)| *r == Some(rank)) {
            return pid;
        }
        assert!(start.elapsed() < limit, "worker of rank {rank} never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The stderr of a running child, read line by line as it is written: a test waits for a line
/// while the process runs (and a child that writes much never stalls on a full pipe).
pub struct Stderr {
    text: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Stderr {
    /// Takes the piped stderr of `child` and reads it on a thread of its own.
    pub fn take(child: &mut Child) -> Stderr {
        use std::io::BufRead;
        let pipe = child.stderr.take().expect("the child's stderr is piped");
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut t = sink.lock().unwrap_or_else(|e| e.into_inner());
                t.push_str(&line);
                t.push('\n');
            }
        });
        Stderr { text, reader: Some(reader) }
    }

    /// What has been read so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until a line read so far satisfies `pred`; that line.
    pub fn wait_line(&self, limit: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(line) = self.text().lines().find(|l| pred(l)) {
                return line.to_string();
            }
            assert!(start.elapsed() < limit, "no line of {what} within {limit:?}; stderr:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the child wrote, once it has closed its stderr (it exited).
    pub fn finish(mut self) -> String {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.text()
    }
}

/// A TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The findings of a report as (code, rank) pairs.
pub fn findings(report: &Value) -> Vec<(String, Option<u64>)> {
    report["findings"]
        .as_array()
        .map(|a| a.iter().map(|f| (f["code"].as_str().unwrap_or("").to_string(), f["rank"].as_u64())).collect())
        .unwrap_or_default()
}
