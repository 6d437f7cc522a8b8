//! Running `scontrol`: a program and its arguments (no shell), with a deadline.

use std::fmt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{check_node_name, check_prefix, parse_show_node, Action, NodeState, SlurmError};

/// How gpusanity talks to Slurm.
#[derive(Debug, Clone)]
pub struct Scontrol {
    /// The scontrol program (`scontrol`, found on PATH, or a path).
    pub program: String,
    /// Log the update that would run instead of running it.
    pub dry_run: bool,
    /// The reason prefix that marks a drain as ours.
    pub prefix: String,
    /// The longest one scontrol call may take (slurmctld unreachable: it retries).
    pub timeout: Duration,
}

/// What one action did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Drained {
        node: String,
        reason: String,
    },
    /// Drained already (by us or anyone): left as it is, its reason kept.
    AlreadyDrained {
        node: String,
        reason: Option<String>,
    },
    Resumed {
        node: String,
    },
    /// Nothing to resume.
    NotDrained {
        node: String,
    },
    /// Drained by someone else: never resumed by gpusanity.
    NotOurs {
        node: String,
        reason: Option<String>,
    },
    DryRun {
        node: String,
        argv: Vec<String>,
    },
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |r: &Option<String>| r.clone().unwrap_or_else(|| "no reason".into());
        match self {
            Outcome::Drained { node, reason } => write!(f, "drained {node}: {reason}"),
            Outcome::AlreadyDrained { node, reason } => {
                write!(f, "{node} is drained already ({}): left as it is", r(reason))
            }
            Outcome::Resumed { node } => write!(f, "resumed {node} (drained by gpusanity, now passing)"),
            Outcome::NotDrained { node } => write!(f, "{node} is not drained: nothing to resume"),
            Outcome::NotOurs { node, reason } => {
                write!(f, "{node} stays drained: drained by someone else ({})", r(reason))
            }
            Outcome::DryRun { node, argv } => write!(f, "dry run: would run for {node}: {}", shown(argv)),
        }
    }
}

impl Scontrol {
    pub fn new(program: &str, prefix: &str, dry_run: bool) -> Result<Scontrol, SlurmError> {
        check_prefix(prefix)?;
        Ok(Scontrol { program: program.into(), dry_run, prefix: prefix.into(), timeout: Duration::from_secs(30) })
    }

    /// `scontrol show node -o NODE`, parsed.
    pub fn show(&self, node: &str) -> Result<NodeState, SlurmError> {
        check_node_name(node)?;
        let out = self.run(&["show".into(), "node".into(), "-o".into(), node.into()])?;
        parse_show_node(node, &out)
    }

    /// The argv of a drain (the reason is one argument: no quoting needed, none added).
    pub fn drain_argv(&self, node: &str, reason: &str) -> Vec<String> {
        let args = ["update".into(), format!("nodename={node}"), "state=drain".into(), format!("reason={reason}")];
        std::iter::once(self.program.clone()).chain(args).collect()
    }

    pub fn resume_argv(&self, node: &str) -> Vec<String> {
        let args = ["update".into(), format!("nodename={node}"), "state=resume".into()];
        std::iter::once(self.program.clone()).chain(args).collect()
    }

    /// Drains `node` unless it is drained already (whoever drained it keeps their reason, so
    /// a drain of someone else's never becomes ours).
    pub fn drain(&self, node: &str, reason: &str) -> Result<Outcome, SlurmError> {
        let state = self.show(node)?;
        if state.is_drained() {
            return Ok(Outcome::AlreadyDrained { node: node.into(), reason: state.reason });
        }
        self.update(node, self.drain_argv(node, reason), Outcome::Drained { node: node.into(), reason: reason.into() })
    }

    /// Resumes `node` only if it is drained with our prefix.
    pub fn resume_if_ours(&self, node: &str) -> Result<Outcome, SlurmError> {
        let state = self.show(node)?;
        if !state.is_drained() {
            return Ok(Outcome::NotDrained { node: node.into() });
        }
        if !state.drained_by(&self.prefix) {
            return Ok(Outcome::NotOurs { node: node.into(), reason: state.reason });
        }
        self.update(node, self.resume_argv(node), Outcome::Resumed { node: node.into() })
    }

    pub fn apply(&self, action: &Action) -> Result<Outcome, SlurmError> {
        match action {
            Action::Drain { node, reason } => self.drain(node, reason),
            Action::ResumeIfOurs { node } => self.resume_if_ours(node),
        }
    }

    fn update(&self, node: &str, argv: Vec<String>, done: Outcome) -> Result<Outcome, SlurmError> {
        if self.dry_run {
            let o = Outcome::DryRun { node: node.into(), argv };
            tracing::info!("slurm: {o}");
            return Ok(o);
        }
        self.run(&argv[1..])?;
        tracing::info!("slurm: {done}");
        Ok(done)
    }

    /// Starts scontrol. "Text file busy" is transient: the program was just written (a package
    /// upgrade, or a test's stand-in) and a process forked elsewhere still holds the file open for
    /// writing until it execs, so it is retried a few times before it counts as an error.
    fn spawn(&self, args: &[String]) -> Result<std::process::Child, SlurmError> {
        let mut tries = 0u32;
        loop {
            let started = Command::new(&self.program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            match started {
                Ok(child) => return Ok(child),
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(source) => return Err(SlurmError::Spawn { program: self.program.clone(), source }),
            }
        }
    }

    /// Runs scontrol with `args`; its stdout on success.
    fn run(&self, args: &[String]) -> Result<String, SlurmError> {
        let argv = || shown(&std::iter::once(self.program.clone()).chain(args.iter().cloned()).collect::<Vec<_>>());
        let mut child = self.spawn(args)?;
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if started.elapsed() < self.timeout => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SlurmError::Timeout { argv: argv(), secs: self.timeout.as_secs() });
                }
            }
        }
        let out =
            child.wait_with_output().map_err(|source| SlurmError::Spawn { program: self.program.clone(), source })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(SlurmError::Failed { argv: argv(), status: out.status.to_string(), stderr });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// An argv as one line for the logs, arguments with spaces in double quotes.
fn shown(argv: &[String]) -> String {
    let quoted: Vec<String> =
        argv.iter().map(|a| if a.contains(' ') { format!("\"{a}\"") } else { a.clone() }).collect();
    quoted.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in scontrol: `show node` prints `STATE_FILE`, `update` appends its argv to a log.
    fn fake(dir: &std::path::Path, show: &str) -> Scontrol {
        std::fs::write(dir.join("show"), show).unwrap();
        let script = format!(
            "#!/bin/sh\nif [ \"$1\" = show ]; then cat {d}/show; exit 0; fi\nfor a in \"$@\"; do printf '%s|' \"$a\" >> {d}/log; done\necho >> {d}/log\n",
            d = dir.display()
        );
        let path = dir.join("scontrol");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scontrol::new(path.to_str().unwrap(), "gpusanity:", false).unwrap()
    }

    fn log(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("log")).unwrap_or_default()
    }

    #[test]
    fn drains_an_idle_node_with_the_reason_as_one_argument() {
        let d = tempfile::tempdir().unwrap();
        let s = fake(d.path(), "NodeName=node2 State=IDLE\n");
        let o = s.drain("node2", "gpusanity: GEMM_WRONG_RESULT in gemm: x y").unwrap();
        assert!(matches!(o, Outcome::Drained { .. }), "{o}");
        assert_eq!(
            log(d.path()),
            "update|nodename=node2|state=drain|reason=gpusanity: GEMM_WRONG_RESULT in gemm: x y|\n"
        );
    }

    #[test]
    fn a_drained_node_is_left_and_only_our_drains_are_resumed() {
        let d = tempfile::tempdir().unwrap();
        let s = fake(d.path(), "NodeName=node3 State=IDLE+DRAIN Reason=maintenance [admin@t]\n");
        assert!(matches!(s.drain("node3", "gpusanity: X").unwrap(), Outcome::AlreadyDrained { .. }));
        assert!(matches!(s.resume_if_ours("node3").unwrap(), Outcome::NotOurs { .. }));
        assert_eq!(log(d.path()), "");
        let s = fake(d.path(), "NodeName=node3 State=IDLE+DRAIN Reason=gpusanity: X [root@t]\n");
        assert_eq!(s.resume_if_ours("node3").unwrap(), Outcome::Resumed { node: "node3".into() });
        assert_eq!(log(d.path()), "update|nodename=node3|state=resume|\n");
        let s = fake(d.path(), "NodeName=node3 State=IDLE\n");
        assert!(matches!(s.resume_if_ours("node3").unwrap(), Outcome::NotDrained { .. }));
    }

    #[test]
    fn a_dry_run_reads_but_only_reports_the_argv() {
        let d = tempfile::tempdir().unwrap();
        let mut s = fake(d.path(), "NodeName=node2 State=IDLE\n");
        s.dry_run = true;
        let o = s.drain("node2", "gpusanity: X y").unwrap();
        let Outcome::DryRun { argv, .. } = &o else { panic!("{o}") };
        assert_eq!(argv[1..], ["update", "nodename=node2", "state=drain", "reason=gpusanity: X y"]);
        assert!(o.to_string().contains("\"reason=gpusanity: X y\""), "{o}");
        assert_eq!(log(d.path()), "");
    }

    #[test]
    fn errors_name_the_command_and_bad_names_never_run() {
        let d = tempfile::tempdir().unwrap();
        let s = fake(d.path(), "NodeName=other State=IDLE\n");
        assert!(matches!(s.drain("node2", "r"), Err(SlurmError::Parse { .. })));
        assert!(matches!(s.drain("node2 state=resume", "r"), Err(SlurmError::BadNodeName(_))));
        let missing = Scontrol::new("/nonexistent/scontrol", "gpusanity:", false).unwrap();
        assert!(matches!(missing.show("node1"), Err(SlurmError::Spawn { .. })));
        let failing = Scontrol::new("false", "gpusanity:", false).unwrap();
        let e = failing.show("node1").unwrap_err().to_string();
        assert!(e.contains("false show node -o node1"), "{e}");
        assert!(Scontrol::new("scontrol", "bad\"prefix", false).is_err());
    }
}
