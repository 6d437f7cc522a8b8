//! One node as `scontrol show node -o NAME` prints it: its state flags and its reason.

use crate::SlurmError;

/// A node's state as Slurm reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    /// The base state and its flags, upper case: `IDLE+DRAIN` is `["IDLE", "DRAIN"]`.
    pub state: Vec<String>,
    /// The reason set with the drain (or down), without Slurm's ` [user@time]` suffix.
    pub reason: Option<String>,
}

impl NodeState {
    /// Drained, or draining (a job still runs on it): the DRAIN flag is set.
    pub fn is_drained(&self) -> bool {
        self.state.iter().any(|s| s == "DRAIN" || s == "DRAINED" || s == "DRAINING")
    }

    /// Drained with a reason that starts with `prefix`: a drain this prefix's owner set.
    pub fn drained_by(&self, prefix: &str) -> bool {
        self.is_drained() && self.reason.as_deref().is_some_and(|r| r.starts_with(prefix))
    }
}

/// Parses the one-line output of `scontrol show node -o NAME` for node `name`.
pub fn parse_show_node(name: &str, text: &str) -> Result<NodeState, SlurmError> {
    let err = |why: &str| SlurmError::Parse { node: name.into(), why: why.into() };
    let line = text
        .lines()
        .find(|l| l.split_whitespace().any(|t| t.strip_prefix("NodeName=") == Some(name)))
        .ok_or_else(|| err("no NodeName= line for this node"))?;
    let state = line.split_whitespace().find_map(|t| t.strip_prefix("State=")).ok_or_else(|| err("no State= field"))?;
    let state = state
        .split('+')
        .map(|s| s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_').to_ascii_uppercase())
        .filter(|s| !s.is_empty())
        .collect();
    // The reason holds spaces: it runs to Slurm's ` [user@time]` (or to the end of the line).
    let reason = line.find(" Reason=").map(|i| strip_stamp(&line[i + " Reason=".len()..])).filter(|r| {
        let r = r.trim();
        !r.is_empty() && r != "(null)" && r != "none"
    });
    Ok(NodeState { name: name.into(), state, reason })
}

/// `text [root@2026-12-01T10:00:00] ...` -> `text`: the last ` [...@...]` ends the reason.
fn strip_stamp(rest: &str) -> String {
    let mut end = rest.len();
    let mut from = 0;
    while let Some(i) = rest[from..].find(" [").map(|i| i + from) {
        if let Some(close) = rest[i..].find(']') {
            if rest[i..i + close].contains('@') {
                end = i;
            }
        }
        from = i + 2;
    }
    rest[..end].trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRAINED: &str = "NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 \
        NodeAddr=10.232.77.2 NodeHostName=node2 Version=22.05.8 RealMemory=1 State=IDLE+DRAIN \
        ThreadsPerCore=1 Partitions=test CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES= CapWatts=n/a \
        Reason=gpusanity: GEMM_WRONG_RESULT rank 1 wrong tile [root@2026-12-01T18:59:26]\n";

    #[test]
    fn reads_state_flags_and_the_reason_without_its_stamp() {
        let n = parse_show_node("node2", DRAINED).unwrap();
        assert_eq!(n.state, ["IDLE", "DRAIN"]);
        assert_eq!(n.reason.as_deref(), Some("gpusanity: GEMM_WRONG_RESULT rank 1 wrong tile"));
        assert!(n.is_drained());
        assert!(n.drained_by("gpusanity:"));
        assert!(!n.drained_by("other:"));
    }

    #[test]
    fn an_idle_node_has_no_reason_and_is_not_drained() {
        let text = "NodeName=node1 Arch=x86_64 State=IDLE ThreadsPerCore=1 Partitions=test\n";
        let n = parse_show_node("node1", text).unwrap();
        assert_eq!(n.state, ["IDLE"]);
        assert_eq!(n.reason, None);
        assert!(!n.is_drained() && !n.drained_by("gpusanity:"));
    }

    #[test]
    fn a_drain_by_someone_else_is_not_ours_and_keys_after_the_stamp_are_cut() {
        let text = "NodeName=node3 State=MIXED+DRAIN+NOT_RESPONDING* Reason=maintenance [admin@2026-12-01T10:00:00] Comment=x\n";
        let n = parse_show_node("node3", text).unwrap();
        assert_eq!(n.state, ["MIXED", "DRAIN", "NOT_RESPONDING"]);
        assert_eq!(n.reason.as_deref(), Some("maintenance"));
        assert!(n.is_drained() && !n.drained_by("gpusanity:"));
        // A reason that only mentions the prefix later is not ours either.
        let text = "NodeName=node3 State=DOWN+DRAIN Reason=bad fan, not gpusanity: [root@t]\n";
        assert!(!parse_show_node("node3", text).unwrap().drained_by("gpusanity:"));
    }

    #[test]
    fn a_reason_with_brackets_keeps_them_and_missing_fields_are_errors() {
        let text = "NodeName=n1 State=DOWN+DRAIN Reason=gpusanity: XID [79] seen [slurm@2026-12-01T10:00:00]";
        assert_eq!(parse_show_node("n1", text).unwrap().reason.as_deref(), Some("gpusanity: XID [79] seen"));
        assert!(parse_show_node("n2", text).is_err());
        assert!(parse_show_node("n1", "NodeName=n1 Arch=x86_64").is_err());
        assert!(parse_show_node("n1", "").is_err());
    }
}
