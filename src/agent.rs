//! `gpusanity agent --node NAME`: one per node; see service/src/agent.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpusanity_common::device::DeviceChoice;
use gpusanity_common::ExitCode;
use gpusanity_service::agent::{self, AgentConfig};
use gpusanity_service::UsageError;

use gpusanity_service::ServiceConfig;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// This node's name, as job events name it.
    #[arg(long, env = "GPUSANITY_NODE")]
    node: String,
    /// The service's TOML configuration file (for the Kafka address and topic names).
    #[arg(long, env = "GPUSANITY_CONFIG")]
    config: Option<PathBuf>,
    /// Kafka bootstrap servers (overrides kafka.bootstrap).
    #[arg(long, env = "GPUSANITY_KAFKA_BOOTSTRAP")]
    kafka: Option<String>,
    /// The address other nodes reach this node at (node 0 hosts the rendezvous on it).
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// Backend for the checks: auto or cuda (a job's GPUs are checked on CUDA, and a node whose
    /// GPUs CUDA cannot use fails), or cpu (test rigs only: GPU jobs checked on CPU workers).
    /// Given twice, the last one counts.
    #[arg(long, default_value_t = DeviceChoice::Auto, value_parser = crate::device_arg::device_parser(), overrides_with = "device")]
    device: DeviceChoice,
    /// Worker processes on this node [default: the number of GPUs, or 2 CPU workers].
    #[arg(long)]
    nproc_per_node: Option<usize>,
    /// Where each run's report and launcher log go (one folder per run).
    #[arg(long, default_value = "gpusanity-agent")]
    work_dir: PathBuf,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 1.0)]
    heartbeat_s: f64,
    /// The agent key file, the service's (overrides agent_auth.keys_file; docs/security.md).
    #[arg(long, env = "GPUSANITY_AGENT_KEYS")]
    agent_keys: Option<PathBuf>,
    /// A variable pattern the jobs' --sanity-check-envs may set on this node (repeatable;
    /// replaces the defaults; passed to each launcher as --allow-env).
    #[arg(long = "allow-env", value_name = "PATTERN", env = "GPUSANITY_ALLOW_ENVS", value_delimiter = ',')]
    allow_envs: Vec<String>,
    /// Test rigs only: let the jobs' GPUSANITY_FAULT through to the workers.
    #[arg(long)]
    test_faults: bool,
    /// As node 0, host the rendezvous on the first free port of FIRST-LAST (the launcher binds
    /// it and keeps it; all taken: the run fails, naming the range) [default: any free port].
    #[arg(long, env = "GPUSANITY_RDZV_PORTS", value_name = "FIRST-LAST")]
    rdzv_ports: Option<gpusanity_common::wire::launcher::PortRange>,
    /// This node's policy for every run: a check parameter CHECK.KEY=VALUE passed to each
    /// launcher after the job's own (so it wins), e.g. gpu-health.leftover-memory-mib=2048
    /// (repeatable; `gpusanity list` shows the keys; an unknown key or a bad value: no start).
    #[arg(long = "check-param", value_name = "CHECK.KEY=VALUE")]
    check_params: Vec<String>,
    /// On Kubernetes: the kubelet's PodResources socket. A job event that names no GPUs for
    /// this node is checked on the GPUs the kubelet gave the job's pods here (found by the
    /// label gpusanity.io/job-id; docs/kubernetes.md) [default: not asked, the whole node].
    #[arg(long, env = "GPUSANITY_KUBELET_POD_RESOURCES", value_name = "SOCKET")]
    kubelet_pod_resources: Option<PathBuf>,
    /// The kubeconfig the agent reads the job's pods with [default: in-cluster, else
    /// $KUBECONFIG or ~/.kube/config].
    #[arg(long, env = "GPUSANITY_KUBECONFIG", value_name = "FILE", requires = "kubelet_pod_resources")]
    kubeconfig: Option<PathBuf>,
    /// The longest wait for the kubelet's answer, in seconds.
    #[arg(long, default_value_t = 5.0, requires = "kubelet_pod_resources")]
    kubelet_timeout_s: f64,
}

impl AgentArgs {
    pub fn config_file(&self) -> Option<PathBuf> {
        self.config.clone()
    }
}

pub fn agent(args: &AgentArgs) -> ExitCode {
    let result = (|| {
        let mut cfg = ServiceConfig::load(args.config.as_deref()).map_err(UsageError)?;
        if let Some(k) = &args.kafka {
            cfg.kafka.bootstrap = k.clone();
        }
        if args.node.trim().is_empty() {
            return Err(UsageError("--node must not be empty".into()).into());
        }
        if !(args.kubelet_timeout_s.is_finite() && args.kubelet_timeout_s > 0.0 && args.kubelet_timeout_s <= 600.0) {
            return Err(
                UsageError("--kubelet-timeout-s must be a positive number of seconds, at most 600".into()).into()
            );
        }
        if !(args.heartbeat_s.is_finite() && args.heartbeat_s > 0.0 && args.heartbeat_s <= 3600.0) {
            return Err(UsageError("--heartbeat-s must be a positive number of seconds".into()).into());
        }
        agent::validate_check_params(args.device, &args.check_params).map_err(UsageError)?;
        if let Some(k) = &args.agent_keys {
            cfg.agent_auth.keys_file = Some(k.clone());
        }
        cfg.agent_auth.validate().map_err(UsageError)?;
        let ring = cfg.agent_auth.keyring().map_err(|e| UsageError(e.to_string()))?;
        if ring.signer_for(&args.node).is_none() {
            return Err(UsageError(format!("no agent key covers node `{}`", args.node)).into());
        }
        let env_policy = gpusanity_common::envs::EnvPolicy::new(&args.allow_envs, args.test_faults)
            .map_err(|e| UsageError(e.to_string()))?;
        let acfg = AgentConfig {
            node: args.node.clone(),
            kafka: cfg.kafka.connection().map_err(UsageError)?,
            topics: cfg.topics,
            address: args.address.clone(),
            device: args.device,
            nproc_per_node: args.nproc_per_node,
            work_dir: args.work_dir.clone(),
            heartbeat: Duration::from_secs_f64(args.heartbeat_s),
            ring,
            max_age: Duration::from_secs(cfg.agent_auth.max_age_s),
            env_policy,
            topic_spec: cfg.kafka.topic_spec().map_err(UsageError)?,
            rdzv_ports: args.rdzv_ports,
            check_params: args.check_params.clone(),
            kubelet: args.kubelet_pod_resources.clone().map(|socket| agent::KubeletGpus {
                socket,
                client: gpusanity_kube::ClientSettings { kubeconfig: args.kubeconfig.clone(), ..Default::default() },
                timeout: Duration::from_secs_f64(args.kubelet_timeout_s),
            }),
        };
        // One thread: each launcher is tied to it by PR_SET_PDEATHSIG.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(agent::run(acfg))
    })();
    match result {
        Ok(()) => ExitCode::Passed,
        Err(e) => crate::report_error(&e),
    }
}

/// `gpusanity watch-record`: the watch's sampler alone (docs/watch.md).
#[derive(Debug, Args)]
pub struct WatchRecordArgs {
    /// The GPUs to sample (UUIDs, PCI addresses or indices, comma-separated) [default: all].
    #[arg(long, value_delimiter = ',')]
    gpus: Vec<String>,
    /// Sampling interval, seconds.
    #[arg(long, default_value_t = 1.0)]
    interval_s: f64,
    /// One summary per period, seconds.
    #[arg(long, default_value_t = 5.0)]
    period_s: f64,
    /// How long to sample, seconds.
    #[arg(long)]
    seconds: f64,
    /// Where the summaries go, one JSON line each [default: standard output].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Samples the GPUs as a watch does, then prints what the sampling cost.
pub fn watch_record(args: &WatchRecordArgs) -> ExitCode {
    let ids: Result<Vec<gpusanity_common::wire::gpu_id::GpuId>, _> = args.gpus.iter().map(|g| g.parse()).collect();
    let ids = match ids {
        Ok(ids) => ids,
        Err(e) => {
            eprintln!("gpusanity watch-record: --gpus: {e}");
            return ExitCode::Usage;
        }
    };
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 86_400.0) {
        eprintln!("gpusanity watch-record: --seconds must be above 0 and at most 86400");
        return ExitCode::Usage;
    }
    let ms = |s: f64| if s.is_finite() && s > 0.0 && s <= 600.0 { (s * 1000.0).round() as u32 } else { 0 };
    let mut out: Box<dyn std::io::Write> = match &args.out {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => Box::new(std::io::BufWriter::new(f)),
            Err(e) => {
                eprintln!("gpusanity watch-record: {}: {e}", p.display());
                return ExitCode::Usage;
            }
        },
        None => Box::new(std::io::stdout()),
    };
    match agent::watch::record(&ids, ms(args.interval_s), ms(args.period_s), args.seconds, &mut out) {
        Ok(c) => {
            eprintln!(
                "gpusanity watch-record: {} summaries in {:.1} s; CPU {:.3} s ({:.3}% of one core)",
                c.summaries,
                c.wall_s,
                c.cpu_s,
                100.0 * c.cpu_s / c.wall_s.max(1e-9)
            );
            ExitCode::Passed
        }
        Err(e) => {
            eprintln!("gpusanity watch-record: {e:#}");
            ExitCode::Usage
        }
    }
}
