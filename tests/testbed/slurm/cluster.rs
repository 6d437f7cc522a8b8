//! Starting and stopping the cluster: munged, slurmctld, three slurmd, each a process group of
//! its own, with a deadline on every wait.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpusanity_slurm::{parse_show_node, NodeState};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::common::{bin, tagged_processes};
use crate::netns::Bed;

pub const NODES: [&str; 3] = ["node1", "node2", "node3"];

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// Marks every process of this cluster (daemons, steps, health checks) in /proc.
    pub tag: String,
    pub bed: Bed,
    /// In start order; stopped in reverse.
    daemons: Vec<(String, Child)>,
}

fn sbin(p: &str) -> String {
    ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|d| Path::new(d).join(p))
        .find(|p| p.is_file())
        .map_or(p.to_string(), |p| p.to_string_lossy().into_owned())
}

/// Waits for `ok` (every 100 ms) up to `limit`; false when it never held.
pub fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ok()
}

impl Cluster {
    /// Builds the bed and starts the daemons; `Err` says why the scenarios must skip here.
    pub fn start(bed: Bed) -> Result<Cluster, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let tag = format!("slurm{}", dir.path().file_name().unwrap_or_default().to_string_lossy().replace('.', ""));
        let d = dir.path().to_path_buf();
        for sub in ["munge", "state", "log", "hc", "spool/node1", "spool/node2", "spool/node3"] {
            std::fs::create_dir_all(d.join(sub)).map_err(|e| e.to_string())?;
        }
        let conf = d.join("slurm.conf");
        let mut c = Cluster { dir, conf, tag, bed, daemons: Vec::new() };
        c.write_files()?;
        c.start_daemons()?;
        Ok(c)
    }

    fn write_files(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let d = self.dir.path();
        let mut key = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?, 1024),
            &mut key,
        )
        .map_err(|e| e.to_string())?;
        let key_file = d.join("munge/munge.key");
        std::fs::write(&key_file, key).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).map_err(|e| e.to_string())?;
        let host = self.bed.host.clone().ok_or("the bed has no host address")?;
        // slurmctld finds itself in SlurmctldHost by its short host name.
        let hostname = nix::unistd::gethostname().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
        let hostname = hostname.split('.').next().unwrap_or_default().to_string();
        let ctld_port = std::net::TcpListener::bind((host.as_str(), 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no port on {host}: {e}"))?
            .port();
        let nodes: String = NODES
            .iter()
            .zip(&self.bed.nodes)
            .map(|(n, b)| format!("NodeName={n} NodeAddr={} CPUs=1 State=UNKNOWN\n", b.addr))
            .collect();
        let p = d.display();
        let conf = format!(
            "ClusterName=gs{pid}\nSlurmctldHost={hostname}({host})\nSlurmctldPort={ctld_port}\nSlurmdPort=16818\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={p}/munge/munge.sock\n\
             SlurmUser=root\nSlurmdUser=root\nStateSaveLocation={p}/state\nSlurmdSpoolDir={p}/spool/%n\n\
             SlurmctldPidFile={p}/slurmctld.pid\nSlurmdPidFile={p}/spool/%n/slurmd.pid\n\
             SlurmctldLogFile={p}/log/slurmctld.log\nSlurmdLogFile={p}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nMpiDefault=none\n\
             SchedulerType=sched/builtin\nSelectType=select/linear\nMailProg=/bin/true\nReturnToService=2\n\
             SlurmctldTimeout=60\nSlurmdTimeout=300\nMessageTimeout=20\nInactiveLimit=0\nMinJobAge=10\nKillWait=5\n\
             HealthCheckProgram={p}/healthcheck.sh\nHealthCheckInterval=5\nHealthCheckNodeState=ANY\n\
             Prolog={p}/prolog.sh\nPrologFlags=Alloc\nPrologEpilogTimeout=120\n\
             {nodes}PartitionName=test Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP\n",
            pid = std::process::id(),
        );
        std::fs::write(&self.conf, conf).map_err(|e| e.to_string())?;
        // What slurmd runs as its HealthCheckProgram: a site's wrapper around the quick check
        // (slurmd gives it SLURMD_NODENAME and nothing else). It does nothing until the test
        // writes hc/on; hc/fault-NODE makes that node's check fail (the test is the operator).
        let script = format!(
            "#!/bin/sh\nd={p}/hc\n[ -f $d/on ] || exit 0\n\
             export PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF={conf} GPUSANITY_TEST_TAG={tag}\n\
             n=$SLURMD_NODENAME\nstart=$(date +%s%N)\n\
             GPUSANITY_FAULT=$(cat $d/fault-$n 2>/dev/null) {bin} check --quick --device cpu --nproc-per-node 1 \
             --test-faults --slurm-drain --report-dir $d/report-$n > $d/out-$n 2>&1\n\
             rc=$?\nend=$(date +%s%N)\necho \"$start $end $rc\" >> $d/runs-$n\n",
            conf = self.conf.display(),
            tag = self.tag,
            bin = bin(),
        );
        let hc = d.join("healthcheck.sh");
        std::fs::write(&hc, script).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&hc, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
        // The prolog: the same quick check, its exit status Slurm's to act on; off until
        // prolog/on exists, with prolog/fault-NODE as above.
        std::fs::create_dir_all(d.join("prolog")).map_err(|e| e.to_string())?;
        let script = format!(
            "#!/bin/sh\nd={p}/prolog\n[ -f $d/on ] || exit 0\n\
             export PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF={conf} GPUSANITY_TEST_TAG={tag}\n\
             n=$SLURMD_NODENAME\n\
             GPUSANITY_FAULT=$(cat $d/fault-$n 2>/dev/null) exec {bin} check --quick --device cpu --nproc-per-node 1 \
             --test-faults --slurm-drain --report-dir $d/report-$n > $d/out-$n 2>&1\n",
            conf = self.conf.display(),
            tag = self.tag,
            bin = bin(),
        );
        let prolog = d.join("prolog.sh");
        std::fs::write(&prolog, script).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&prolog, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
    }

    /// A daemon in a process group of its own, its output in log/NAME.out, carrying the tag.
    fn spawn(&mut self, name: &str, argv: &[String]) -> Result<(), String> {
        let out = std::fs::File::create(self.dir.path().join(format!("log/{name}.out"))).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("SLURM_CONF", &self.conf)
            .env("GPUSANITY_TEST_TAG", &self.tag)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("{}: {e}", argv[0]))?;
        self.daemons.push((name.to_string(), child));
        Ok(())
    }

    fn start_daemons(&mut self) -> Result<(), String> {
        let d = self.dir.path().display().to_string();
        let munged: Vec<String> = [
            sbin("munged"),
            "-F".into(),
            "--force".into(),
            format!("--socket={d}/munge/munge.sock"),
            format!("--key-file={d}/munge/munge.key"),
            format!("--pid-file={d}/munge/munged.pid"),
            format!("--log-file={d}/munge/munged.log"),
            format!("--seed-file={d}/munge/munged.seed"),
        ]
        .into();
        self.spawn("munged", &munged)?;
        let sock = self.dir.path().join("munge/munge.sock");
        self.expect(wait_for(Duration::from_secs(10), || sock.exists()), "munged never made its socket");
        let conf = self.conf.display().to_string();
        self.spawn("slurmctld", &[sbin("slurmctld"), "-D".into(), "-f".into(), conf.clone()])?;
        self.expect(
            wait_for(Duration::from_secs(30), || self.slurm("scontrol", &["ping"]).status.success()),
            "slurmctld never answered",
        );
        for (k, n) in NODES.iter().enumerate() {
            let net = format!("--net=/run/netns/{}", self.bed.nodes[k].ns);
            let argv = [
                "nsenter".into(),
                net,
                sbin("slurmd"),
                "-D".into(),
                "-N".into(),
                n.to_string(),
                "-f".into(),
                conf.clone(),
            ];
            self.spawn(n, &argv)?;
        }
        let idle = wait_for(Duration::from_secs(60), || {
            self.daemons_alive() && NODES.iter().all(|n| self.state(n).is_ok_and(|s| s.state == ["IDLE"]))
        });
        if !idle {
            let log = self.logs();
            // A daemon that ended at its start (slurmd without a usable cgroup file system,
            // for one) says that Slurm cannot run on this machine, not that gpusanity failed.
            if !self.daemons_alive() {
                let errors: Vec<&str> = log.lines().filter(|l| l.contains("error")).collect();
                let tail = errors[errors.len().saturating_sub(3)..].join(" | ");
                return Err(format!("a Slurm daemon ended at its start here: {tail}"));
            }
            panic!(
                "the Slurm nodes never became idle:\n{}\n{log}",
                String::from_utf8_lossy(&self.slurm("sinfo", &["-N"]).stdout)
            );
        }
        Ok(())
    }

    fn expect(&self, ok: bool, what: &str) {
        assert!(ok, "{what}:\n{}", self.logs());
    }

    fn daemons_alive(&self) -> bool {
        self.daemons.iter().all(|(_, c)| nix::sys::signal::kill(Pid::from_raw(c.id() as i32), None).is_ok())
    }

    /// Every daemon's output and log, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for sub in ["log", "munge"] {
            let mut files: Vec<_> =
                std::fs::read_dir(self.dir.path().join(sub)).into_iter().flatten().flatten().collect();
            files.sort_by_key(|e| e.path());
            for f in files.iter().filter(|f| f.path().extension().is_some_and(|e| e == "log" || e == "out")) {
                let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                all += &format!("== {}\n", f.path().display());
                for l in tail.iter().rev() {
                    all += &format!("{l}\n");
                }
            }
        }
        all
    }

    /// A Slurm client command against this cluster, with a deadline.
    pub fn slurm(&self, program: &str, args: &[&str]) -> Output {
        let mut c = Command::new(program);
        c.args(args).env("SLURM_CONF", &self.conf);
        crate::common::run_with_timeout(c, Duration::from_secs(60))
    }

    /// `scontrol show node NODE`, parsed by the code under test's parser.
    pub fn state(&self, node: &str) -> Result<NodeState, String> {
        let out = self.slurm("scontrol", &["show", "node", "-o", node]);
        parse_show_node(node, &String::from_utf8_lossy(&out.stdout)).map_err(|e| e.to_string())
    }

    /// A command run as a job step from the host: `srun ARGS`, with this cluster's config and
    /// tag and a clean check environment.
    pub fn srun(&self, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
        let mut c = Command::new("srun");
        c.args(args).env("SLURM_CONF", &self.conf).env("GPUSANITY_TEST_TAG", &self.tag);
        for v in ["SANITY_CHECK_ARGS", "ENABLE_SANITY_CHECK", "GPUSANITY_FAULT", "GPUSANITY_NODE_NAMES", "PET_NNODES"] {
            c.env_remove(v);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdin(Stdio::null());
        crate::common::run_with_timeout(c, limit)
    }

    /// Stops every daemon (SIGTERM to its group, SIGKILL after 10 s), then returns and kills
    /// what is left carrying the tag (a step or health check that outlived its slurmd).
    pub fn stop(&mut self) -> Vec<i32> {
        for (_, child) in self.daemons.iter_mut().rev() {
            let pgid = Pid::from_raw(child.id() as i32);
            let _ = killpg(pgid, Signal::SIGTERM);
            let start = Instant::now();
            while !matches!(child.try_wait(), Ok(Some(_))) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
        }
        self.daemons.clear();
        let left: Vec<i32> = tagged_processes(&self.tag).into_iter().map(|(pid, _)| pid).collect();
        for pid in &left {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        left
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
