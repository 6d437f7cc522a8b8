//! One run of this node's launcher (`gpusanity check` as a child process) and its end.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use gpusanity_common::device::DeviceChoice;
use gpusanity_common::report::Report;
use gpusanity_common::wire::agent::{NodeResult, Task};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};

use super::AgentConfig;
use crate::auth::rdzv;

/// How long a cancelled launcher gets to stop its workers and tell the other nodes.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub struct Launch;

impl Launch {
    /// Starts the launcher; returns node 0's rendezvous port. Its end is sent on `exits`.
    pub fn start(
        cfg: &AgentConfig,
        t: &Task,
        secret: Option<[u8; rdzv::SECRET_LEN]>,
        cancel: oneshot::Receiver<()>,
        exits: mpsc::UnboundedSender<NodeResult>,
    ) -> Result<Option<u16>> {
        let dir = cfg.work_dir.join(&t.run_id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (addr, port, own_port) = match &t.master {
            Some((a, p)) => (a.clone(), *p, None),
            None if t.node_rank == 0 => {
                let p = std::net::TcpListener::bind(("0.0.0.0", 0))?.local_addr()?.port();
                (cfg.address.clone(), p, Some(p))
            }
            None => anyhow::bail!("task for node {} without node 0's address", t.node_rank),
        };
        let left = (t.deadline - chrono::Utc::now()).to_std().unwrap_or_default().max(Duration::from_secs(1));
        let log = std::fs::File::create(dir.join("launcher.log"))?;
        let mut cmd = Command::new(std::env::current_exe().context("finding the gpusanity binary")?);
        cmd.arg("check")
            .args(["--device", launcher_device(cfg.device).as_str(), "--node-name", &cfg.node])
            .args(["--nnodes", &t.nnodes.to_string(), "--node-rank", &t.node_rank.to_string()])
            .args(["--master-addr", &addr, "--master-port", &port.to_string()])
            .arg("--report-dir")
            .arg(dir.join("report"))
            .args(["--rdzv-timeout", &format!("{:.3}", left.as_secs_f64())])
            .arg(format!("--sanity-check-args={}", t.sanity_check_args))
            // The service applied the timing policy and applies the timeout policy itself.
            .args(["--sanity-check-timing=BeforeJobRunning", "--sanity-check-timeout-ops=MarkJobFail"]);
        if let Some(n) = cfg.nproc_per_node {
            cmd.args(["--nproc-per-node", &n.to_string()]);
        }
        // This node's policy for the job's environment, enforced by the launcher too.
        cmd.arg(format!("--allow-env={}", cfg.env_policy.allowed_patterns().join(",")));
        if cfg.env_policy.test_faults {
            cmd.arg("--test-faults");
        }
        if let Some(secret) = secret {
            let path = dir.join("rdzv.secret");
            write_private(&path, hex::encode(secret).as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            cmd.arg("--rdzv-secret-file").arg(&path);
        }
        // The service decided to check: no setting of the agent's own environment may skip it.
        for v in ["ENABLE_SANITY_CHECK", "SANITY_CHECK_ARGS", "GPUSANITY_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"] {
            cmd.env_remove(v);
        }
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        // SAFETY: set_pdeathsig only calls prctl(2), which is async-signal-safe, between fork
        // and exec. It makes the kernel SIGTERM the launcher when the agent dies, so a killed
        // agent leaves no launcher behind (and the launcher's workers follow it).
        unsafe {
            cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from));
        }
        let mut child = cmd.spawn().context("starting the launcher")?;
        let pid = child.id().map(|p| Pid::from_raw(p as i32));
        let (run_id, node_rank) = (t.run_id.clone(), t.node_rank);
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
            let exit_code = status.as_ref().ok().and_then(|s| s.code());
            let report = if node_rank == 0 { read_report(&dir.join("report").join("report.json")) } else { None };
            let error = match &status {
                Err(e) => Some(format!("waiting for the launcher: {e}")),
                Ok(s) if !s.success() => {
                    last_error(&dir.join("launcher.log")).or_else(|| Some(format!("launcher ended: {s}")))
                }
                Ok(_) => None,
            };
            let _ = exits.send(NodeResult { run_id, node_rank, exit_code, report, error });
        });
        Ok(own_port)
    }
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

    #[test]
    fn a_gpu_job_is_checked_on_cuda_unless_the_agent_was_started_on_cpu() {
        assert_eq!(launcher_device(DeviceChoice::Auto), DeviceChoice::Cuda);
        assert_eq!(launcher_device(DeviceChoice::Cuda), DeviceChoice::Cuda);
        assert_eq!(launcher_device(DeviceChoice::Cpu), DeviceChoice::Cpu);
    }
}
