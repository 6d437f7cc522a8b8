//! The Kubernetes side of `gpusanity check`: after node 0's verdict, `--k8s-isolate` isolates
//! the faulty nodes of a failed run (cordon, taint, label, condition, Event) and returns the
//! nodes of a passing run that gpusanity isolated (docs/kubernetes.md). The logic is the
//! `gpusanity-kube` crate's, shared with the service's backend; this file maps flags to it and
//! reports what it did. Mirrors `--slurm-drain` (src/slurm.rs): a failed API call is a warning,
//! the verdict and the exit code stand.

use std::path::PathBuf;

use clap::Args;
use gpusanity_common::report::{NodeHealth, Report, RunStatus};
use gpusanity_kube::{ClientSettings, Effect, Isolator, Outcome};

#[derive(Debug, Args)]
pub struct KubeArgs {
    /// After the verdict (on node 0, which has it): isolate the faulty Nodes of a failed run
    /// (cordon, `gpusanity.io/faulty` taint, label, condition, Event) and return the Nodes of a
    /// passing run that gpusanity isolated (never a cordon or taint of someone else's). An API
    /// server that cannot be reached is a warning; the verdict stands.
    #[arg(long)]
    k8s_isolate: bool,
    /// As --k8s-isolate, with every write sent as a dry run (checked by the API server, stored nowhere).
    #[arg(long)]
    k8s_dry_run: bool,
    /// This node's Kubernetes Node name (in a pod: `NODE_NAME` from the downward API,
    /// `spec.nodeName`); node 0's own verdict is acted on under it. Other nodes of the run go by
    /// their report names (give every pod `--node-name=$(NODE_NAME)`) [default: node 0's name
    /// in the report].
    #[arg(long, env = "NODE_NAME", value_name = "NODE")]
    k8s_node: Option<String>,
    /// A kubeconfig file [default: $KUBECONFIG, ~/.kube/config, then the pod's service account].
    #[arg(long, value_name = "PATH")]
    k8s_kubeconfig: Option<PathBuf>,
    /// A bearer token file replacing the kubeconfig user's credentials.
    #[arg(long, value_name = "PATH")]
    k8s_token_file: Option<PathBuf>,
    /// The taint's effect: `NoSchedule`, or `NoExecute` (also evicts pods without a toleration).
    #[arg(long, default_value = "NoSchedule", value_parser = parse_effect, value_name = "EFFECT")]
    k8s_taint_effect: Effect,
}

fn parse_effect(s: &str) -> Result<Effect, String> {
    match s {
        "NoSchedule" => Ok(Effect::NoSchedule),
        "NoExecute" => Ok(Effect::NoExecute),
        _ => Err("NoSchedule or NoExecute".into()),
    }
}

/// One write the verdict asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Isolate { node: String, code: String, message: String },
    ReturnIfOurs { node: String },
}

impl KubeArgs {
    pub fn wanted(&self) -> bool {
        self.k8s_isolate || self.k8s_dry_run
    }

    /// The Node name of the report's node `rank` named `host`.
    fn node_name(&self, rank: usize, host: &str) -> String {
        match &self.k8s_node {
            Some(n) if rank == 0 => n.clone(),
            _ => host.to_string(),
        }
    }

    /// The writes for `report`: a failed or timed-out run isolates its faulty nodes (suspect
    /// ones are only reported), a passed run returns its nodes if gpusanity isolated them, a
    /// skipped run does nothing (as `--slurm-drain`).
    pub fn plan(&self, report: &Report) -> Vec<Step> {
        let verdicts = report.node_verdicts.iter();
        match report.status {
            RunStatus::Skipped => Vec::new(),
            RunStatus::Passed => {
                verdicts.map(|v| Step::ReturnIfOurs { node: self.node_name(v.node_rank, &v.host) }).collect()
            }
            RunStatus::Failed | RunStatus::TimedOut => verdicts
                .filter(|v| v.health == NodeHealth::Faulty)
                .map(|v| {
                    let codes: Vec<String> = v.codes.iter().map(|c| c.to_string()).collect();
                    let evidence = report.evidence(v.node_rank).map(|f| format!(" in {}: {}", f.check, f.message));
                    Step::Isolate {
                        node: self.node_name(v.node_rank, &v.host),
                        code: codes.first().cloned().unwrap_or_else(|| "UNKNOWN".into()),
                        message: format!("{}{}", codes.join(","), evidence.unwrap_or_default()),
                    }
                })
                .collect(),
        }
    }

    /// Carries out the report's writes; every failure is a warning on stderr.
    pub async fn act(&self, report: &Report) {
        let steps = self.plan(report);
        if steps.is_empty() {
            return;
        }
        let settings = ClientSettings {
            kubeconfig: self.k8s_kubeconfig.clone(),
            token_file: self.k8s_token_file.clone(),
            ..Default::default()
        };
        let client = match settings.client().await {
            Ok(c) => c,
            Err(e) => return eprintln!("gpusanity: kubernetes: warning: {e}; no Node was changed"),
        };
        let isolator = Isolator::new(client, self.k8s_taint_effect, self.k8s_dry_run);
        let dry = if self.k8s_dry_run { "dry run: " } else { "" };
        for step in steps {
            let (node, result) = match &step {
                Step::Isolate { node, code, message } => (node, isolator.isolate(node, code, message).await),
                Step::ReturnIfOurs { node } => (node, isolator.restore(node).await),
            };
            match result {
                Ok(Outcome::Isolated(r)) => eprintln!("gpusanity: kubernetes: {dry}isolated {node} ({})", r.code),
                Ok(Outcome::AlreadyIsolated) => eprintln!("gpusanity: kubernetes: {node} was isolated already"),
                Ok(Outcome::Returned(_)) => eprintln!("gpusanity: kubernetes: {dry}returned {node} to service"),
                Ok(Outcome::NotOurs) => {}
                Err(e) => eprintln!(
                    "gpusanity: kubernetes: warning: {e} (the rights needed: deploy/kubernetes/rbac.yaml, docs/kubernetes.md)"
                ),
            }
        }
    }
}
