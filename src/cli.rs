//! The command line: `gpusanity check`, `gpusanity list` and the hidden `gpusanity worker`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::device::DeviceChoice;
use gpusanity_common::envs::EnvPolicy;
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::report::DeviceKind;
use gpusanity_common::wire::launcher::PortRange;
use gpusanity_common::{Descriptor, ExitCode, Settings};
use gpusanity_executor::launcher::{self, rendezvous::TopologyFlags, CheckOptions, Handover, UsageError};
use gpusanity_executor::store::auth::SECRET_ENV;
use gpusanity_executor::store::Secret;

/// `-V`: the version and the commit the binary was built from (build.rs).
pub const SHORT_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("GPUSANITY_GIT_COMMIT"), ")");

/// `--version`: [`SHORT_VERSION`], the CUDA generation of the bindings and the CUDA libraries
/// bundled beside the binary, read at run time (the image adds them after the build).
pub fn long_version() -> &'static str {
    static LONG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LONG.get_or_init(|| {
        format!(
            "{SHORT_VERSION}\nCUDA bindings: {} (an NVIDIA driver of release {} or later)\n{}",
            gpusanity_cuda::CUDA_GENERATION,
            gpusanity_cuda::MIN_DRIVER_MAJOR,
            gpusanity_cuda::bundled::describe()
        )
    })
}

/// The longest rendezvous wait `--rdzv-timeout` takes, in seconds.
const MAX_RDZV_TIMEOUT_S: f64 = 86_400.0;

#[derive(Debug, Parser)]
#[command(name = "gpusanity", version = SHORT_VERSION, about = "Compute health check for distributed GPU training")]
pub struct Cli {
    /// Log what happens (or set GPUSANITY_LOG, e.g. GPUSANITY_LOG=debug).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// Log format on stderr: text (coloured only on a terminal) or json (one object per line);
    /// else `[log] format` of the --config file of serve/agent, else text.
    #[arg(long, global = true, env = "GPUSANITY_LOG_FORMAT", value_name = "json|text")]
    pub log_format: Option<gpusanity_service::ops::LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check this node's GPUs and links with the job's other nodes, then run COMMAND on a pass.
    Check(Box<CheckArgs>),
    /// List the check items.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Render a report.json again as its HTML page.
    Report(ReportArgs),
    /// Run the service: Kafka job events in, check runs on the agents, results in the database, events out.
    Serve(Box<crate::serve::ServeArgs>),
    /// Run the agent of one node: takes its tasks from the service and runs the data plane.
    Agent(Box<crate::agent::AgentArgs>),
    /// Sample this node's GPUs as the watch of a running job does, writing each period's
    /// summary as a JSON line (a recording, and the sampler's own cost).
    WatchRecord(crate::agent::WatchRecordArgs),
    /// Fleet baselines: `export` writes the file `check --baseline` reads.
    #[command(subcommand)]
    Baseline(crate::baseline::BaselineCommand),
    /// A worker process (started by `check`, one per device).
    #[command(hide = true)]
    Worker,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The report.json written by `gpusanity check` (or fetched from the service).
    report: PathBuf,
    /// Where to write the page [default: REPORT with the extension .html].
    #[arg(long, short)]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Number of nodes in the job [env: PET_NNODES, WORLD_SIZE (Kubeflow), SLURM_NNODES; default 1].
    #[arg(long)]
    nnodes: Option<usize>,
    /// This node's rank [env: PET_NODE_RANK, RANK (Kubeflow), SLURM_NODEID; default 0].
    #[arg(long)]
    node_rank: Option<usize>,
    /// Worker processes on this node [default: the number of GPUs, or 2 CPU workers].
    #[arg(long)]
    nproc_per_node: Option<usize>,
    /// Address of node 0, which hosts the rendezvous [env: PET_MASTER_ADDR, MASTER_ADDR, first host of SLURM_JOB_NODELIST].
    #[arg(long)]
    master_addr: Option<String>,
    /// Rendezvous port on node 0 [env: PET_MASTER_PORT, MASTER_PORT; default 29500, any free port on one node].
    #[arg(long)]
    master_port: Option<u16>,
    /// On node 0: listen on the first free port of FIRST-LAST instead of --master-port.
    #[arg(long, value_name = "FIRST-LAST")]
    master_port_range: Option<PortRange>,
    /// On node 0: print the port it listens on, as one JSON line on stdout (for the agent).
    #[arg(long, hide = true)]
    announce_port: bool,
    /// The job's hosts in node-rank order, as a Slurm host list (`gpu[01-04],cpu1`), so that a
    /// node that never arrives is named [env: GPUSANITY_NODE_NAMES, SLURM_JOB_NODELIST].
    #[arg(long)]
    node_names: Option<String>,
    /// Seconds to wait for the other nodes at the rendezvous.
    #[arg(long, default_value_t = 300.0)]
    rdzv_timeout: f64,
    /// File holding the run's rendezvous secret (at least 16 bytes, trailing whitespace trimmed;
    /// mode 0600), the same on every node: it authenticates every connection to the rendezvous
    /// store and between CPU workers [env: GPUSANITY_RDZV_SECRET, the secret itself]. Without
    /// one a single node listens on loopback only and a multi-node rendezvous is unauthenticated.
    #[arg(long, value_name = "PATH")]
    rdzv_secret_file: Option<PathBuf>,
    /// Backend: CUDA when a GPU is usable (auto), or force one.
    #[arg(long, default_value_t = DeviceChoice::Auto, value_parser = crate::device_arg::device_parser())]
    device: DeviceChoice,

    /// EnableSanityCheck: run the check at all (false: straight to COMMAND).
    #[arg(long, env = "ENABLE_SANITY_CHECK", default_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    enable_sanity_check: bool,
    /// SanityCheckArgs: all the settings in one string, e.g. "--sanity-check-timing=AfterJobFaultTolerant".
    /// The individual flags below override it.
    #[arg(long, env = "SANITY_CHECK_ARGS", allow_hyphen_values = true)]
    sanity_check_args: Option<String>,
    /// BeforeJobRunning | AfterJobFaultTolerant [default: BeforeJobRunning].
    #[arg(long)]
    sanity_check_timing: Option<String>,
    /// Minutes for the whole check [default: 30].
    #[arg(long, allow_hyphen_values = true)]
    sanity_check_max_time: Option<String>,
    /// MarkJobFail | KeepJobHang [default: MarkJobFail].
    #[arg(long)]
    sanity_check_timeout_ops: Option<String>,
    /// k1=v1,k2=v2: environment for the check processes (not for COMMAND).
    #[arg(long)]
    sanity_check_envs: Option<String>,
    /// Minutes per test [default: 6].
    #[arg(long, allow_hyphen_values = true)]
    sanity_check_timeout_per_test: Option<String>,
    /// Comma list of micro-benchmarks [default: gemm,all-reduce,gpu-health].
    #[arg(long)]
    micro_benchmarks: Option<String>,
    /// Comma list of model benchmarks [default: none].
    #[arg(long)]
    model_benchmarks: Option<String>,
    /// Times the job has been restarted; AfterJobFaultTolerant checks only when it is above 0
    /// [env: GPUSANITY_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT; default 0].
    #[arg(long, env = "GPUSANITY_RESTART_COUNT")]
    restart_count: Option<u64>,
    /// Override a check parameter: CHECK.KEY=VALUE, e.g. gemm.size=4096 (repeatable; `gpusanity list` shows them).
    #[arg(long = "check-param", value_name = "CHECK.KEY=VALUE")]
    check_params: Vec<String>,
    /// The name this node goes by in the report, its findings and Slurm actions [env:
    /// SLURMD_NODENAME (set by Slurm in steps, prologs and health checks); default: the hostname].
    #[arg(long)]
    node_name: Option<String>,
    /// Quick single-node mode (a Slurm prolog or HealthCheckProgram): gpu-health, gemm,
    /// kernel-launch and memory-bandwidth on this node alone, no rendezvous (SLURM_NNODES and
    /// the job's other nodes are ignored), 30 s per test and 45 s in all unless given.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    slurm: crate::slurm::SlurmArgs,
    #[command(flatten)]
    k8s: crate::k8s::KubeArgs,
    /// An environment-variable pattern `--sanity-check-envs` may set (`NCCL_*`, `UCX_TLS`;
    /// repeatable; replaces the defaults, see docs/security.md). Loader, file, path, plugin
    /// and gpusanity variables stay refused whatever is allowed.
    #[arg(long = "allow-env", value_name = "PATTERN", env = "GPUSANITY_ALLOW_ENVS", value_delimiter = ',')]
    allow_envs: Vec<String>,
    /// Test rigs only: let GPUSANITY_FAULT (fault injection) reach the workers, from
    /// --sanity-check-envs or this process's environment. Off, it is refused (exit 2) or removed.
    #[arg(long)]
    test_faults: bool,
    /// A fleet baseline (`gpusanity baseline export`): every headline figure is also judged
    /// against the entry learned for its device, driver, check and conditions (BELOW_FLEET),
    /// and each rank's report entry carries its fleet percentile. docs/fleet.md.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Where node 0 writes report.json and events.jsonl.
    #[arg(long, default_value = "gpusanity-report")]
    report_dir: PathBuf,
    /// The job's command, started in place of gpusanity after a pass.
    #[arg(last = true)]
    command: Vec<String>,
}

impl CheckArgs {
    /// Defaults, then SanityCheckArgs, then the individual flags; validated once.
    fn settings(&self) -> Result<Settings, gpusanity_common::SettingsError> {
        let mut s = Settings::default();
        if self.quick {
            for (name, value) in crate::slurm::QUICK {
                s.apply(name, value)?;
            }
        }
        if let Some(args) = &self.sanity_check_args {
            s.apply_args_str(args)?;
        }
        let flags = [
            ("--sanity-check-timing", &self.sanity_check_timing),
            ("--sanity-check-max-time", &self.sanity_check_max_time),
            ("--sanity-check-timeout-ops", &self.sanity_check_timeout_ops),
            ("--sanity-check-envs", &self.sanity_check_envs),
            ("--sanity-check-timeout-per-test", &self.sanity_check_timeout_per_test),
            ("--micro-benchmarks", &self.micro_benchmarks),
            ("--model-benchmarks", &self.model_benchmarks),
        ];
        for (name, value) in flags {
            if let Some(v) = value {
                s.apply(name, v)?;
            }
        }
        s.validate()?;
        Ok(s)
    }

    fn restart_count(&self) -> Result<u64, UsageError> {
        if let Some(n) = self.restart_count {
            return Ok(n);
        }
        match std::env::var("TORCHELASTIC_RESTART_COUNT") {
            Ok(v) => v.trim().parse().map_err(|_| {
                UsageError(format!("bad TORCHELASTIC_RESTART_COUNT `{v}`: expected a non-negative integer"))
            }),
            Err(_) => Ok(0),
        }
    }

    /// `--rdzv-secret-file`, else `GPUSANITY_RDZV_SECRET`, else none.
    fn rdzv_secret(&self) -> Result<Option<Secret>, UsageError> {
        let secret = match (&self.rdzv_secret_file, std::env::var_os(SECRET_ENV)) {
            (Some(path), _) => Secret::from_file(path),
            (None, Some(v)) => Secret::new(v.as_encoded_bytes(), SECRET_ENV),
            (None, None) => return Ok(None),
        };
        secret.map(Some).map_err(|e| UsageError(e.to_string()))
    }

    fn options(&self) -> Result<CheckOptions> {
        if self.node_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(UsageError("--node-name must not be empty".into()).into());
        }
        if !(self.rdzv_timeout.is_finite() && self.rdzv_timeout > 0.0 && self.rdzv_timeout <= MAX_RDZV_TIMEOUT_S) {
            return Err(UsageError(format!(
                "--rdzv-timeout must be a positive number of seconds, at most {MAX_RDZV_TIMEOUT_S} (one day)"
            ))
            .into());
        }
        Ok(CheckOptions {
            topology: self.topology()?,
            nproc_per_node: self.nproc_per_node,
            device: self.device,
            settings: self.settings()?,
            enabled: self.enable_sanity_check,
            restart_count: self.restart_count()?,
            check_params: self.check_params.clone(),
            report_dir: self.report_dir.clone(),
            node_name: self
                .node_name
                .clone()
                .or_else(|| std::env::var("SLURMD_NODENAME").ok().filter(|n| !n.trim().is_empty())),
            rdzv_timeout: Duration::from_secs_f64(self.rdzv_timeout),
            rdzv_secret: self.rdzv_secret()?,
            command: self.command.clone(),
            env_policy: EnvPolicy::new(&self.allow_envs, self.test_faults).map_err(|e| UsageError(e.to_string()))?,
            baseline: match &self.baseline {
                Some(path) => {
                    Some(std::sync::Arc::new(BaselineFile::read(path).map_err(|e| UsageError(e.to_string()))?))
                }
                None => None,
            },
        })
    }
}

impl CheckArgs {
    /// The flags, or with `--quick` this node alone on loopback (the job's environment ignored).
    fn topology(&self) -> Result<TopologyFlags, UsageError> {
        let flags = TopologyFlags {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            node_names: self.node_names.clone(),
            port_range: self.master_port_range,
            announce_port: self.announce_port,
        };
        if self.quick {
            crate::slurm::quick_topology(&flags)
        } else {
            Ok(flags)
        }
    }
}

impl Cli {
    /// The configuration file of `serve` or `agent`, if one is named.
    pub fn config_file(&self) -> Option<std::path::PathBuf> {
        match &self.command {
            Command::Serve(a) => a.config_file(),
            Command::Agent(a) => a.config_file(),
            _ => None,
        }
    }
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::List { json } => list(json),
        Command::Worker => match gpusanity_executor::worker::main() {
            Ok(()) => ExitCode::Passed,
            Err(e) => crate::report_error(&e),
        },
        Command::Check(args) => check(&args),
        Command::Report(args) => report(&args),
        Command::Baseline(cmd) => crate::baseline::baseline(&cmd),
        Command::Serve(args) => crate::serve::serve(&args),
        Command::Agent(args) => crate::agent::agent(&args),
        Command::WatchRecord(args) => crate::agent::watch_record(&args),
    }
}

fn check(args: &CheckArgs) -> ExitCode {
    let result = args.options().and_then(|opts| {
        let slurm = args.slurm.scontrol()?;
        // One thread: workers are tied to it by PR_SET_PDEATHSIG, so it must live as long as
        // the launcher does.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let finished = rt.block_on(launcher::check(opts))?;
        if let (Some(scontrol), Some(report)) = (&slurm, &finished.report) {
            crate::slurm::act(scontrol, report);
        }
        if let (true, Some(report)) = (args.k8s.wanted(), &finished.report) {
            rt.block_on(args.k8s.act(report));
        }
        Ok(finished.handover)
    });
    match result {
        Ok(Handover::Exit(code)) => code,
        Ok(Handover::Exec(cmd)) => exec(&cmd),
        Err(e) => crate::report_error(&e),
    }
}

fn report(args: &ReportArgs) -> ExitCode {
    let out = args.out.clone().unwrap_or_else(|| args.report.with_extension("html"));
    let result = std::fs::read(&args.report)
        .map_err(|e| UsageError(format!("cannot read {}: {e}", args.report.display())))
        .and_then(|bytes| {
            let text = String::from_utf8_lossy(&bytes);
            gpusanity_reports::lenient::read(&text)
                .map_err(|e| UsageError(format!("{} is not a gpusanity report: {e}", args.report.display())))
        })
        .and_then(|r| {
            gpusanity_reports::validate::validate(&r.report)
                .map(|()| r)
                .map_err(|e| UsageError(format!("{} is not a valid gpusanity report: {e}", args.report.display())))
        })
        .map_err(anyhow::Error::from)
        .and_then(|r| {
            for part in &r.left_out {
                tracing::warn!("left out of the page (written by another gpusanity version): {part}");
            }
            let ctx = gpusanity_reports::html::RunContext { left_out: r.left_out, ..Default::default() };
            launcher::write_html(&out, &r.report, &ctx)
        });
    match result {
        Ok(()) => {
            println!("{}", out.display());
            ExitCode::Passed
        }
        Err(e) => crate::report_error(&e),
    }
}

/// Replaces this process with COMMAND, so the job's exit status is the training's own.
fn exec(cmd: &[String]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let Some((prog, rest)) = cmd.split_first() else { return ExitCode::Passed };
    // The rendezvous secret is the check's, not the job's.
    let err = std::process::Command::new(prog).args(rest).env_remove(SECRET_ENV).exec();
    eprintln!("gpusanity: error: cannot start `{prog}`: {err}");
    ExitCode::ExecFailed
}

fn list(json: bool) -> ExitCode {
    let checks: Vec<&Descriptor> = gpusanity_common::checks::listed().collect();
    if json {
        let v = serde_json::json!({
            "checks": checks,
            "defaults": {
                "cpu": CheckConfigs::defaults(DeviceKind::Cpu),
                "cuda": CheckConfigs::defaults(DeviceKind::Cuda),
            },
            "check_params": gpusanity_common::checks::param_keys(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return ExitCode::Passed;
    }
    println!("{:<27} {:<6} {:>13} {:>8}  finds", "check", "group", "reference est", "our est");
    for c in &checks {
        println!("{:<27} {:<6} {:>12}s {:>7}s  {}", c.id, c.group, c.reference_estimate_s, c.estimate_s, c.description);
    }
    println!("\ndefault configuration (override with --check-param CHECK.KEY=VALUE):");
    for (name, kind) in [("cuda", DeviceKind::Cuda), ("cpu", DeviceKind::Cpu)] {
        let c = CheckConfigs::defaults(kind);
        for d in &checks {
            println!("  {name}: {} {}", d.id, d.id.config_value(&c));
        }
        println!("  {name}: diagnosis slow-fraction {}", c.slow_fraction);
    }
    println!("\n--check-param keys:");
    for k in gpusanity_common::checks::param_keys() {
        println!("  {k}");
    }
    ExitCode::Passed
}
