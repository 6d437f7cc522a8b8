//! The Slurm side of `gpusanity check`: `--quick` (one node alone, a short check set) and,
//! after node 0's verdict, `--slurm-drain` (drain the faulty nodes, resume the nodes of a
//! passing run that gpusanity drained; docs/slurm.md). The logic is the `gpusanity-slurm`
//! crate's; this file only maps flags to it and reports what it did.

use clap::Args;
use gpusanity_common::report::Report;
use gpusanity_executor::launcher::rendezvous::TopologyFlags;
use gpusanity_executor::launcher::UsageError;
use gpusanity_slurm::{plan, Scontrol, DEFAULT_PREFIX};

/// The settings of `--quick`, under SanityCheckArgs and the flags: what fits well inside the
/// 60 s Slurm gives a HealthCheckProgram (about 5 s on a GPU node, 2 s on one CPU worker).
pub const QUICK: [(&str, &str); 3] = [
    ("--micro-benchmarks", "gpu-health,gemm,kernel-launch,memory-bandwidth"),
    ("--sanity-check-timeout-per-test", "0.5"),
    ("--sanity-check-max-time", "0.75"),
];

/// `--quick`: this node alone on loopback, whatever the job's environment says (a prolog of a
/// multi-node job has its SLURM_* variables); flags that name other nodes are refused.
pub fn quick_topology(flags: &TopologyFlags) -> Result<TopologyFlags, UsageError> {
    if flags.nnodes.is_some_and(|n| n != 1)
        || flags.node_rank.is_some_and(|r| r != 0)
        || flags.node_names.is_some()
        || flags.port_range.is_some()
    {
        return Err(UsageError(
            "--quick checks this node alone: drop --nnodes, --node-rank, --node-names and --master-port-range".into(),
        ));
    }
    Ok(TopologyFlags {
        nnodes: Some(1),
        node_rank: Some(0),
        master_addr: Some("127.0.0.1".into()),
        master_port: Some(flags.master_port.unwrap_or(0)),
        node_names: None,
        port_range: None,
        announce_port: flags.announce_port,
    })
}

#[derive(Debug, Args)]
pub struct SlurmArgs {
    /// After the verdict (on node 0, which has it): drain the faulty nodes with
    /// `scontrol update nodename=NODE state=drain reason="gpusanity: CODE ..."`, and on a pass
    /// resume the nodes that gpusanity drained (never a drain of someone else's). Needs Slurm
    /// operator rights; without them it warns and the verdict stands.
    #[arg(long)]
    slurm_drain: bool,
    /// As --slurm-drain, but only log the scontrol updates it would run (it still reads the nodes).
    #[arg(long)]
    slurm_dry_run: bool,
    /// The reason prefix that marks a drain as gpusanity's (only those are resumed).
    #[arg(long, default_value = DEFAULT_PREFIX, value_name = "TEXT")]
    slurm_reason_prefix: String,
    /// The scontrol program.
    #[arg(long, env = "GPUSANITY_SCONTROL", default_value = "scontrol", value_name = "PATH")]
    scontrol: String,
}

impl SlurmArgs {
    /// The scontrol runner if a Slurm action was asked for; a bad prefix is bad input.
    pub fn scontrol(&self) -> Result<Option<Scontrol>, UsageError> {
        if !(self.slurm_drain || self.slurm_dry_run) {
            return Ok(None);
        }
        Scontrol::new(&self.scontrol, &self.slurm_reason_prefix, self.slurm_dry_run)
            .map(Some)
            .map_err(|e| UsageError(format!("--slurm-reason-prefix: {e}")))
    }
}

/// Carries out the report's actions; a failed scontrol call is a warning (the verdict and the
/// exit code stand: Slurm's own handling of a failed prolog or step still applies).
pub fn act(scontrol: &Scontrol, report: &Report) {
    for action in plan(report, &scontrol.prefix) {
        match scontrol.apply(&action) {
            Ok(outcome) => eprintln!("gpusanity: slurm: {outcome}"),
            Err(e) => {
                eprintln!("gpusanity: slurm: warning: {e} (scontrol update needs Slurm operator rights: docs/slurm.md)")
            }
        }
    }
}
