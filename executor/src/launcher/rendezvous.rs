//! Where this node sits in the job: from flags, or from the environment that torchrun
//! (`PET_*`), Kubeflow PyTorchJob (`WORLD_SIZE` = pods, `RANK` = pod index, `MASTER_ADDR`,
//! `MASTER_PORT`) and Slurm (`SLURM_NNODES`, `SLURM_NODEID`, `SLURM_JOB_NODELIST`) set.
//! A flag wins over `PET_*`, which wins over Kubeflow, which wins over Slurm.

use std::collections::HashMap;

use gpusanity_common::wire::launcher::PortRange;
use thiserror::Error;

use crate::store::Ports;

pub const DEFAULT_PORT: u16 = 29500;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    /// 0 on a single node with no port given: node 0 picks a free port.
    pub master_port: u16,
    /// Where node 0 listens: `master_port`, or the first free port of `--master-port-range`.
    pub listen: Ports,
    /// Node 0 tells its parent the port it listens on (`--announce-port`: a notice on stdout).
    pub announce_port: bool,
    /// Where the values came from, for the logs.
    pub source: &'static str,
    /// The hosts by node rank, where the job says them (`--node-names`, `GPUSANITY_NODE_NAMES`,
    /// or `SLURM_JOB_NODELIST` when it lists as many hosts as there are nodes); else empty.
    pub node_names: Vec<String>,
}

/// The rendezvous flags as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct TopologyFlags {
    pub nnodes: Option<usize>,
    pub node_rank: Option<usize>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    pub node_names: Option<String>,
    /// Node 0 listens on the first free port of this range (not with `master_port`).
    pub port_range: Option<PortRange>,
    pub announce_port: bool,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("bad value `{value}` in environment variable {var}: expected {expected}")]
    BadEnv { var: String, value: String, expected: &'static str },
    #[error("--node-rank {0} is not below --nnodes {1}")]
    RankOutOfRange(usize, usize),
    #[error("--nnodes must be at least 1")]
    NoNodes,
    #[error("a job of {0} nodes needs --master-addr (or MASTER_ADDR): the address of node 0")]
    NoMaster(usize),
    #[error("--node-names (or GPUSANITY_NODE_NAMES): {0}")]
    NodeNames(String),
    #[error("--master-port and --master-port-range exclude each other")]
    PortAndRange,
}

/// Resolves the topology from `flags` and the environment `env`.
pub fn resolve(flags: &TopologyFlags, env: &HashMap<String, String>) -> Result<Topology, TopologyError> {
    let num = |var: &str| parse_env::<usize>(env, var, "a non-negative integer");
    let port = |var: &str| parse_env::<u16>(env, var, "a TCP port");
    let s = |var: &str| env.get(var).filter(|v| !v.is_empty()).cloned();

    // (source, nnodes, node_rank, master_addr, master_port), in order of precedence.
    let slurm_master = s("SLURM_JOB_NODELIST").and_then(|l| first_host(&l));
    let layers = [
        ("flags", flags.nnodes, flags.node_rank, flags.master_addr.clone(), flags.master_port),
        ("torchrun", num("PET_NNODES")?, num("PET_NODE_RANK")?, s("PET_MASTER_ADDR"), port("PET_MASTER_PORT")?),
        ("kubeflow", num("WORLD_SIZE")?, num("RANK")?, s("MASTER_ADDR"), port("MASTER_PORT")?),
        ("slurm", num("SLURM_NNODES")?, num("SLURM_NODEID")?, slurm_master, None),
    ];
    let mut nnodes = None;
    let mut node_rank = None;
    let mut addr = None;
    let mut mport = None;
    let mut source = "default";
    for (name, n, r, a, p) in layers {
        if nnodes.is_none() && n.is_some() {
            nnodes = n;
            if source == "default" {
                source = name;
            }
        }
        node_rank = node_rank.or(r);
        addr = addr.or(a);
        mport = mport.or(p);
    }
    let nnodes = nnodes.unwrap_or(1);
    let node_rank = node_rank.unwrap_or(0);
    if nnodes == 0 {
        return Err(TopologyError::NoNodes);
    }
    if node_rank >= nnodes {
        return Err(TopologyError::RankOutOfRange(node_rank, nnodes));
    }
    let master_addr = match addr {
        Some(a) => a,
        None if nnodes == 1 => "127.0.0.1".into(),
        None => return Err(TopologyError::NoMaster(nnodes)),
    };
    let master_port = mport.unwrap_or(if nnodes == 1 { 0 } else { DEFAULT_PORT });
    let listen = match (flags.port_range, flags.master_port) {
        (Some(_), Some(_)) => return Err(TopologyError::PortAndRange),
        (Some(range), None) => Ports::Range(range),
        (None, _) => Ports::One(master_port),
    };
    let node_names = match flags.node_names.clone().or_else(|| s("GPUSANITY_NODE_NAMES")) {
        Some(list) => {
            let names =
                gpusanity_common::hostlist::expand(&list).map_err(|e| TopologyError::NodeNames(e.to_string()))?;
            if names.len() != nnodes {
                return Err(TopologyError::NodeNames(format!("lists {} hosts for {nnodes} nodes", names.len())));
            }
            names
        }
        // Slurm's list is in SLURM_NODEID order; a list of another length (a step on some of
        // the job's nodes) says nothing about this run's ranks.
        None => s("SLURM_JOB_NODELIST")
            .and_then(|l| gpusanity_common::hostlist::expand(&l).ok())
            .filter(|names| names.len() == nnodes)
            .unwrap_or_default(),
    };
    let announce_port = flags.announce_port;
    Ok(Topology { nnodes, node_rank, master_addr, master_port, listen, announce_port, source, node_names })
}

fn parse_env<T: std::str::FromStr>(
    env: &HashMap<String, String>,
    var: &str,
    expected: &'static str,
) -> Result<Option<T>, TopologyError> {
    env.get(var)
        .map(|v| {
            v.trim().parse::<T>().map_err(|_| TopologyError::BadEnv { var: var.into(), value: v.clone(), expected })
        })
        .transpose()
}

/// The first host of a Slurm host list: `gpu[01-04,07],cpu1` gives `gpu01`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..];
        let first = inner.split([',', '-', ']']).next()?;
        Some(format!("{prefix}{first}"))
    } else if prefix.is_empty() {
        None
    } else {
        Some(prefix.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn single_machine_default() {
        let t = resolve(&TopologyFlags::default(), &env(&[])).unwrap();
        assert_eq!((t.nnodes, t.node_rank, t.master_addr.as_str(), t.master_port), (1, 0, "127.0.0.1", 0));
    }

    #[test]
    fn flags_win_over_env() {
        let flags = TopologyFlags {
            nnodes: Some(2),
            node_rank: Some(1),
            master_addr: Some("10.0.0.1".into()),
            master_port: Some(1234),
            ..Default::default()
        };
        let t = resolve(&flags, &env(&[("WORLD_SIZE", "4"), ("RANK", "3"), ("MASTER_ADDR", "x")])).unwrap();
        assert_eq!(
            (t.nnodes, t.node_rank, t.master_addr.as_str(), t.master_port, t.source),
            (2, 1, "10.0.0.1", 1234, "flags")
        );
    }

    #[test]
    fn kubeflow_pytorchjob() {
        let t = resolve(
            &TopologyFlags::default(),
            &env(&[("WORLD_SIZE", "3"), ("RANK", "2"), ("MASTER_ADDR", "job-master-0"), ("MASTER_PORT", "23456")]),
        )
        .unwrap();
        assert_eq!(
            (t.nnodes, t.node_rank, t.master_addr.as_str(), t.master_port, t.source),
            (3, 2, "job-master-0", 23456, "kubeflow")
        );
    }

    #[test]
    fn torchrun_pet_env_wins_over_kubeflow() {
        let t = resolve(
            &TopologyFlags::default(),
            &env(&[
                ("PET_NNODES", "2"),
                ("PET_NODE_RANK", "1"),
                ("PET_MASTER_ADDR", "m"),
                ("WORLD_SIZE", "16"),
                ("RANK", "9"),
            ]),
        )
        .unwrap();
        assert_eq!((t.nnodes, t.node_rank, t.master_addr.as_str(), t.master_port), (2, 1, "m", DEFAULT_PORT));
    }

    #[test]
    fn slurm() {
        let t = resolve(
            &TopologyFlags::default(),
            &env(&[("SLURM_NNODES", "4"), ("SLURM_NODEID", "3"), ("SLURM_JOB_NODELIST", "gpu[07-10]")]),
        )
        .unwrap();
        assert_eq!((t.nnodes, t.node_rank, t.master_addr.as_str()), (4, 3, "gpu07"));
        assert_eq!(first_host("a1,b2"), Some("a1".into()));
        assert_eq!(first_host("n[3,5-6]"), Some("n3".into()));
    }

    #[test]
    fn bad_input() {
        assert_eq!(
            resolve(&TopologyFlags::default(), &env(&[("WORLD_SIZE", "two")])).unwrap_err().to_string(),
            "bad value `two` in environment variable WORLD_SIZE: expected a non-negative integer"
        );
        let f = TopologyFlags { nnodes: Some(2), node_rank: Some(2), ..Default::default() };
        assert_eq!(resolve(&f, &env(&[])).unwrap_err(), TopologyError::RankOutOfRange(2, 2));
        let f = TopologyFlags { nnodes: Some(2), ..Default::default() };
        assert_eq!(resolve(&f, &env(&[])).unwrap_err(), TopologyError::NoMaster(2));
    }

    #[test]
    fn node_0_listens_on_its_port_or_the_first_free_one_of_a_range() {
        let t = resolve(&TopologyFlags::default(), &env(&[("MASTER_PORT", "29600")])).unwrap();
        assert_eq!(t.listen, Ports::One(29600));
        let range: PortRange = "29500-29599".parse().unwrap();
        let flags = TopologyFlags { nnodes: Some(2), port_range: Some(range), ..Default::default() };
        let t = resolve(&flags, &env(&[("MASTER_ADDR", "m"), ("MASTER_PORT", "29600")])).unwrap();
        assert_eq!(t.listen, Ports::Range(range), "the flag wins over the environment's port");
        let flags = TopologyFlags { master_port: Some(1), port_range: Some(range), ..Default::default() };
        assert_eq!(resolve(&flags, &env(&[])).unwrap_err(), TopologyError::PortAndRange);
    }

    #[test]
    fn node_names_come_from_the_flag_or_a_slurm_list_of_the_job_size() {
        let slurm = env(&[("SLURM_NNODES", "4"), ("SLURM_NODEID", "1"), ("SLURM_JOB_NODELIST", "gpu[07-10]")]);
        assert_eq!(
            resolve(&TopologyFlags::default(), &slurm).unwrap().node_names,
            ["gpu07", "gpu08", "gpu09", "gpu10"]
        );
        let flags = TopologyFlags { nnodes: Some(2), node_names: Some("gpu[07-08]".into()), ..Default::default() };
        assert_eq!(resolve(&flags, &slurm).unwrap().node_names, ["gpu07", "gpu08"]);
        let flags = TopologyFlags { nnodes: Some(3), ..Default::default() };
        assert!(resolve(&flags, &slurm).unwrap().node_names.is_empty(), "a list of 4 names for 3 nodes");
        let flags = TopologyFlags { nnodes: Some(3), node_names: Some("a,b".into()), ..Default::default() };
        assert!(matches!(resolve(&flags, &slurm), Err(TopologyError::NodeNames(_))));
        let flags = TopologyFlags { nnodes: Some(3), node_names: Some("a[1-".into()), ..Default::default() };
        assert!(matches!(resolve(&flags, &slurm), Err(TopologyError::NodeNames(_))));
    }
}
