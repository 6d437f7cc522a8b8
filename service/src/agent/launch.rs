//! One run of this node's launcher (`gpusanity check` as a child process) and its end.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use gpusanity_common::config::health::MAX_GPUS_PER_NODE;
use gpusanity_common::device::{DeviceChoice, NvidiaHardware};
use gpusanity_common::report::Report;
use gpusanity_common::wire::agent::{NodeResult, Task};
use gpusanity_common::wire::gpu_id::GpuId;
use gpusanity_common::wire::launcher::LauncherNotice;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};

use super::AgentConfig;
use crate::auth::rdzv;

/// How long a cancelled launcher gets to stop its workers and tell the other nodes.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a finished launcher's stdout may take to drain into its log.
const RELAY_GRACE: Duration = Duration::from_secs(2);
/// The longest line of the launcher's stdout read at once (a longer one is read in pieces).
const MAX_LINE: u64 = 64 * 1024;

/// Node 0's launcher listens for the rendezvous on `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub run_id: String,
    pub port: u16,
}

pub struct Launch;

impl Launch {
    /// Starts the launcher; its end is sent on `exits`. Node 0's launcher binds the rendezvous
    /// port itself (any free one, or the first free one of the agent's range) and keeps it; the
    /// port it tells on its stdout is sent on `bound`. Returns whether one will be (node 0).
    pub fn start(
        cfg: &AgentConfig,
        t: &Task,
        secret: Option<[u8; rdzv::SECRET_LEN]>,
        cancel: oneshot::Receiver<()>,
        exits: mpsc::UnboundedSender<NodeResult>,
        bound: mpsc::UnboundedSender<Bound>,
    ) -> Result<bool> {
        let dir = cfg.work_dir.join(&t.run_id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (addr, port) = master(cfg, t)?;
        let mut cmd = launcher_command(cfg, t, &dir, &addr, port)?;
        if let Some(secret) = secret {
            let path = dir.join("rdzv.secret");
            write_private(&path, hex::encode(secret).as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            cmd.arg("--rdzv-secret-file").arg(&path);
        }
        with_baseline(&mut cmd, &dir, t)?;
        environment(&mut cmd, cfg, t)?;
        let announces = port.is_none();
        let (child, relay_log) = spawn(cmd, &dir)?;
        let ended = Ended { dir, run_id: t.run_id.clone(), node_rank: t.node_rank, exits };
        watch(child, relay_log, announces.then(|| (bound, t.run_id.clone())), cancel, ended);
        Ok(announces)
    }
}

/// Node 0's address and port for this node's launcher: the task's, or this node's own address
/// and a port node 0's launcher binds itself (None).
fn master(cfg: &AgentConfig, t: &Task) -> Result<(String, Option<u16>)> {
    match &t.master {
        Some((a, p)) => Ok((a.clone(), Some(*p))),
        None if t.node_rank == 0 => Ok((cfg.address.clone(), None)),
        None => anyhow::bail!("task for node {} without node 0's address", t.node_rank),
    }
}

/// `gpusanity check` for this node's part of the run: the place, the rendezvous, the job's
/// arguments under the service's policies, then the operator's.
fn launcher_command(cfg: &AgentConfig, t: &Task, dir: &Path, addr: &str, port: Option<u16>) -> Result<Command> {
    let left = (t.deadline - chrono::Utc::now()).to_std().unwrap_or_default().max(Duration::from_secs(1));
    let mut cmd = Command::new(std::env::current_exe().context("finding the gpusanity binary")?);
    cmd.arg("check")
        .args(["--device", launcher_device(cfg.device).as_str(), "--node-name", &cfg.node])
        .args(["--nnodes", &t.nnodes.to_string(), "--node-rank", &t.node_rank.to_string()])
        .args(["--master-addr", addr]);
    match (port, cfg.rdzv_ports) {
        (Some(p), _) => cmd.args(["--master-port", &p.to_string()]),
        (None, Some(range)) => cmd.args(["--announce-port", "--master-port-range", &range.to_string()]),
        (None, None) => cmd.args(["--announce-port", "--master-port", "0"]),
    };
    cmd.arg("--report-dir")
        .arg(dir.join("report"))
        .args(["--rdzv-timeout", &format!("{:.3}", left.as_secs_f64())])
        .arg(format!("--sanity-check-args={}", t.sanity_check_args))
        // The service applied the timing policy and applies the timeout policy itself.
        .args(["--sanity-check-timing=BeforeJobRunning", "--sanity-check-timeout-ops=MarkJobFail"]);
    if let Some(n) = cfg.nproc_per_node {
        cmd.args(["--nproc-per-node", &n.to_string()]);
    }
    if let Some(param) = expected_gpus(cfg.device, t.gpus) {
        cmd.args(["--check-param", &param]);
    }
    // The operator's policy last: the launcher applies its parameters in order.
    for param in &cfg.check_params {
        cmd.args(["--check-param", param]);
    }
    // This node's policy for the job's environment, enforced by the launcher too.
    cmd.arg(format!("--allow-env={}", cfg.env_policy.allowed_patterns().join(",")));
    if cfg.env_policy.test_faults {
        cmd.arg("--test-faults");
    }
    Ok(cmd)
}

/// The fleet's baselines, as `gpusanity baseline export` writes them: node 0 judges the run's
/// figures against them too (a task is signed, but the file is validated as the launcher
/// validates any: a bad one is left out, and the static floor still judges).
fn with_baseline(cmd: &mut Command, dir: &Path, t: &Task) -> Result<()> {
    let Some(b) = &t.baseline else { return Ok(()) };
    match b.validate().map_err(anyhow::Error::from).and_then(|()| Ok(b.to_text("fleet baselines from the service")?)) {
        Ok(text) => {
            let path = dir.join("baseline.toml");
            write_private(&path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
            cmd.arg("--baseline").arg(&path);
        }
        Err(e) => tracing::warn!(run_id = t.run_id, "the task's fleet baselines are invalid, left out: {e}"),
    }
    Ok(())
}

/// The launcher's environment: nothing of the agent's that could skip the check, and exactly
/// the job's GPUs on a shared node, in the order its ranks use them.
fn environment(cmd: &mut Command, cfg: &AgentConfig, t: &Task) -> Result<()> {
    for v in ["ENABLE_SANITY_CHECK", "SANITY_CHECK_ARGS", "GPUSANITY_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"] {
        cmd.env_remove(v);
    }
    for (k, v) in visible_devices(cfg.device, &t.gpu_ids, &NvidiaHardware::of_this_node().pci_gpus)? {
        cmd.env(k, v);
    }
    Ok(())
}

/// Starts the launcher with its stderr in `dir/launcher.log` and its stdout piped (the agent
/// copies it there, taking node 0's notice from it); returns it and the log to copy into.
fn spawn(mut cmd: Command, dir: &Path) -> Result<(Child, tokio::fs::File)> {
    let log = std::fs::File::create(dir.join("launcher.log"))?;
    let relay_log = tokio::fs::File::from_std(log.try_clone()?);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log).kill_on_drop(true);
    // SAFETY: set_pdeathsig only calls prctl(2), which is async-signal-safe, between fork
    // and exec. It makes the kernel SIGTERM the launcher when the agent dies, so a killed
    // agent leaves no launcher behind (and the launcher's workers follow it).
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from));
    }
    Ok((cmd.spawn().context("starting the launcher")?, relay_log))
}

/// Where a launcher's end goes.
struct Ended {
    dir: PathBuf,
    run_id: String,
    node_rank: usize,
    exits: mpsc::UnboundedSender<NodeResult>,
}

/// Waits in the background for the launcher's end (a cancel: SIGTERM, then a kill after
/// [`STOP_GRACE`]), while its stdout is relayed, and sends its result.
fn watch(
    mut child: Child,
    relay_log: tokio::fs::File,
    announce: Option<(mpsc::UnboundedSender<Bound>, String)>,
    cancel: oneshot::Receiver<()>,
    ended: Ended,
) {
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let relaying = child.stdout.take().map(|out| tokio::spawn(relay(out, relay_log, announce)));
    tokio::spawn(async move {
        let status = tokio::select! {
            s = child.wait() => s,
            _ = cancel => {
                if let Some(pid) = pid {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = child.kill().await;
                        child.wait().await
                    }
                }
            }
        };
        // The launcher's last stdout lines reach its log before the log is read; a pipe kept
        // open by something the launcher left behind does not hold the result back.
        if let Some(relaying) = relaying {
            let _ = tokio::time::timeout(RELAY_GRACE, relaying).await;
        }
        let _ = ended.exits.send(result(&ended, &status));
    });
}

/// The node's result from the launcher's exit: node 0 adds its report; a failure its last error.
fn result(e: &Ended, status: &std::io::Result<std::process::ExitStatus>) -> NodeResult {
    let exit_code = status.as_ref().ok().and_then(|s| s.code());
    let report = if e.node_rank == 0 { read_report(&e.dir.join("report").join("report.json")) } else { None };
    let error = match status {
        Err(err) => Some(format!("waiting for the launcher: {err}")),
        Ok(s) if !s.success() => {
            last_error(&e.dir.join("launcher.log")).or_else(|| Some(format!("launcher ended: {s}")))
        }
        Ok(_) => None,
    };
    NodeResult { run_id: e.run_id.clone(), node_rank: e.node_rank, exit_code, report, report_chunks: None, error }
}

/// Copies the launcher's stdout to its log; the first port notice on it (node 0) goes to `bound`.
async fn relay(out: ChildStdout, mut log: tokio::fs::File, mut bound: Option<(mpsc::UnboundedSender<Bound>, String)>) {
    let mut r = tokio::io::BufReader::new(out);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut r).take(MAX_LINE).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let notice = bound.as_ref().and_then(|_| std::str::from_utf8(&line).ok()).and_then(LauncherNotice::parse);
        if let Some(LauncherNotice::RendezvousBound { port }) = notice {
            if let Some((tx, run_id)) = bound.take() {
                let _ = tx.send(Bound { run_id, port });
            }
        }
        // A log that cannot be written loses the line; the pipe is still drained.
        let _ = log.write_all(&line).await;
    }
    // tokio's file hands each write to a blocking thread and returns before it lands: without
    // the flush, the launcher's last lines may not be in the log when its exit is reported.
    let _ = log.flush().await;
}

/// The launcher's `--device` for a job the service checks (one with GPUs: the others are out
/// of scope and never reach an agent): CUDA, so that a node whose GPUs cannot be used fails
/// the check instead of passing it on CPUs; the CPU backend only where the operator started
/// the agent with `--device cpu` (a test rig), which the report's backend then says.
fn launcher_device(agent: DeviceChoice) -> DeviceChoice {
    match agent {
        DeviceChoice::Cpu => DeviceChoice::Cpu,
        DeviceChoice::Auto | DeviceChoice::Cuda => DeviceChoice::Cuda,
    }
}

/// The GPU count the job asked for on this node, as the launcher's `--check-param`: on a GPU
/// node only (a CPU test rig has none to count), and within what the parameter takes (a larger
/// count cannot be met by any node: it is left to the workers' own count).
fn expected_gpus(agent: DeviceChoice, gpus: Option<u32>) -> Option<String> {
    let n = gpus.filter(|n| *n > 0 && u64::from(*n) <= MAX_GPUS_PER_NODE)?;
    (launcher_device(agent) == DeviceChoice::Cuda).then(|| format!("gpu-health.expected-gpus={n}"))
}

/// The device variables that give the launcher exactly the job's GPUs (`gpu_ids`), in order:
/// UUIDs as they are, indices and PCI addresses as indices in the node's PCI order
/// (`CUDA_DEVICE_ORDER=PCI_BUS_ID`; `pci_gpus`: the node's GPUs by PCI address, sorted). None
/// for a whole-node job, or for CPU workers (a rig's agent with `--device cpu`).
fn visible_devices(agent: DeviceChoice, ids: &[GpuId], pci_gpus: &[String]) -> Result<Vec<(&'static str, String)>> {
    if ids.is_empty() || launcher_device(agent) != DeviceChoice::Cuda {
        return Ok(Vec::new());
    }
    let mut list = Vec::with_capacity(ids.len());
    for id in ids {
        list.push(match id {
            GpuId::Uuid(u) => u.clone(),
            GpuId::Index(i) => i.to_string(),
            GpuId::Pci(p) => {
                pci_gpus.iter().position(|g| g.eq_ignore_ascii_case(p)).map(|i| i.to_string()).with_context(|| {
                    format!("the job's GPU {p} is not on this node (its GPUs: {})", pci_gpus.join(", "))
                })?
            }
        });
    }
    let mut vars = vec![("CUDA_VISIBLE_DEVICES", list.join(","))];
    if !matches!(ids.first(), Some(GpuId::Uuid(_))) {
        vars.push(("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()));
    }
    Ok(vars)
}

/// Writes `bytes` to a new file only its owner can read.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}

fn read_report(path: &std::path::Path) -> Option<Box<Report>> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).map_err(|e| tracing::warn!("unreadable report {}: {e}", path.display())).ok()
}

/// The launcher's one-line error, if it printed one.
fn last_error(log: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find(|l| l.contains("error")).map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_port_notice_is_taken_from_stdout_and_every_line_logged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("launcher.log");
        let log = tokio::fs::File::create(&path).await.expect("log");
        let notice = LauncherNotice::RendezvousBound { port: 29517 }.line();
        let script = format!("echo before; echo '{notice}'; echo '{notice}'; echo after");
        let mut child = Command::new("sh").args(["-c", &script]).stdout(Stdio::piped()).spawn().expect("sh");
        let (tx, mut rx) = mpsc::unbounded_channel();
        relay(child.stdout.take().expect("stdout"), log, Some((tx, "r1".into()))).await;
        child.wait().await.expect("sh ends");
        assert_eq!(rx.recv().await, Some(Bound { run_id: "r1".into(), port: 29517 }));
        assert_eq!(rx.recv().await, None, "one notice is sent, once");
        let text = std::fs::read_to_string(&path).expect("log");
        assert_eq!(text, format!("before\n{notice}\n{notice}\nafter\n"));
    }

    #[test]
    fn a_gpu_job_is_checked_on_cuda_unless_the_agent_was_started_on_cpu() {
        assert_eq!(launcher_device(DeviceChoice::Auto), DeviceChoice::Cuda);
        assert_eq!(launcher_device(DeviceChoice::Cuda), DeviceChoice::Cuda);
        assert_eq!(launcher_device(DeviceChoice::Cpu), DeviceChoice::Cpu);
    }

    #[test]
    fn the_gpus_the_job_asked_for_are_counted_on_gpu_nodes_only() {
        assert_eq!(expected_gpus(DeviceChoice::Auto, Some(8)).as_deref(), Some("gpu-health.expected-gpus=8"));
        assert_eq!(expected_gpus(DeviceChoice::Cuda, Some(1)).as_deref(), Some("gpu-health.expected-gpus=1"));
        assert_eq!(expected_gpus(DeviceChoice::Cpu, Some(8)), None);
        assert_eq!(expected_gpus(DeviceChoice::Cuda, None), None);
        assert_eq!(expected_gpus(DeviceChoice::Cuda, Some(0)), None);
        assert_eq!(expected_gpus(DeviceChoice::Cuda, Some(u32::MAX)), None);
    }

    #[test]
    fn the_jobs_gpus_become_its_visible_devices_in_order() {
        let ids = |v: &[&str]| v.iter().map(|s| s.parse::<GpuId>().unwrap()).collect::<Vec<_>>();
        let node = ["0000:19:00.0".to_string(), "0000:3b:00.0".to_string(), "0000:5d:00.0".to_string()];
        let cuda = DeviceChoice::Auto;
        assert_eq!(visible_devices(cuda, &[], &node).unwrap(), []);
        assert_eq!(visible_devices(DeviceChoice::Cpu, &ids(&["1"]), &node).unwrap(), []);
        let by_index = visible_devices(cuda, &ids(&["2", "0"]), &node).unwrap();
        assert_eq!(by_index, [("CUDA_VISIBLE_DEVICES", "2,0".into()), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".into())]);
        let by_pci = visible_devices(cuda, &ids(&["0000:5d:00.0", "0000:3B:00.0"]), &node).unwrap();
        assert_eq!(by_pci[0], ("CUDA_VISIBLE_DEVICES", "2,1".into()));
        let uuid = "GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99";
        assert_eq!(visible_devices(cuda, &ids(&[uuid]), &node).unwrap(), [("CUDA_VISIBLE_DEVICES", uuid.into())]);
        let missing = visible_devices(cuda, &ids(&["0000:99:00.0"]), &node).unwrap_err().to_string();
        assert!(missing.contains("0000:99:00.0") && missing.contains("not on this node"), "{missing}");
    }
}
