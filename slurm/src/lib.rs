//! Slurm as gpusanity's isolation backend: a failed verdict drains the faulty nodes through
//! `scontrol update nodename=NODE state=drain reason="gpusanity: CODE evidence"`, and a later
//! passing check resumes a node only if it is drained and its reason carries gpusanity's
//! prefix (a node someone else drained stays drained).
//!
//! `scontrol` is run as a program with arguments, never through a shell; node names are
//! checked and reasons are sanitised (bounded, printable ASCII, no quotes). A dry run still
//! reads the node (`scontrol show node`, which any user may) and logs the exact argv of the
//! update it would run. Used by `gpusanity check --slurm-drain` (node 0, which has the
//! verdict) and by the service's isolation backend (`service/src/isolation.rs`).

mod node;
mod plan;
mod reason;
mod scontrol;

pub use node::{parse_show_node, NodeState};
pub use plan::{plan, Action};
pub use reason::{check_prefix, drain_reason, sanitise, DEFAULT_PREFIX, MAX_REASON};
pub use scontrol::{Outcome, Scontrol};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SlurmError {
    #[error("cannot run `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("`{argv}` failed ({status}): {stderr}")]
    Failed { argv: String, status: String, stderr: String },
    #[error("`{argv}` did not finish within {secs} s")]
    Timeout { argv: String, secs: u64 },
    #[error("cannot read `scontrol show node` output for {node}: {why}")]
    Parse { node: String, why: String },
    #[error("`{0}` is not a Slurm node name (letters, digits, `.`, `_`, `-`; at most 64)")]
    BadNodeName(String),
    #[error("the drain reason prefix must be printable text without quotes, 1 to 32 characters: `{0}`")]
    BadPrefix(String),
}

/// A Slurm node name as scontrol takes it: one host, no host-list brackets, no spaces or `=`
/// (which would add a key to the update), not starting with `-` (an option).
pub fn check_node_name(name: &str) -> Result<(), SlurmError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(SlurmError::BadNodeName(name.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_single_hosts_without_keys_or_options() {
        for ok in ["node2", "gpu-a01", "n1.cluster", "x_y"] {
            assert!(check_node_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-h", "node[1-3]", "a b", "a=b", "node2 state=resume", "n\"1", &"a".repeat(65)] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
    }
}
