//! Which processes on the job's GPUs are the job's. The watch starts when the job's check has
//! passed, before the job's own processes open their GPUs; the processes that appear on the
//! job's GPUs within [`SETTLE`] of the first one are the job's, and so are their descendants
//! later (a data loader that opens CUDA). Any other process computing on a job's GPU after
//! that is foreign. A process whose ancestry cannot be read (another PID namespace) is not
//! called foreign: the watch would rather miss one than accuse the job's own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use gpusanity_common::wire::watch::{ForeignProcess, MAX_FOREIGN, MAX_NAME};

/// How long after the first process appears the job's processes are still being learned.
pub(crate) const SETTLE: Duration = Duration::from_secs(30);
/// The deepest ancestry followed.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct Owners {
    job: HashSet<u32>,
    /// When the learning ends; None until a first process appears.
    settled_at: Option<Instant>,
}

impl Owners {
    /// For each GPU's (pid, MiB) list, the processes that are not the job's.
    pub fn foreign(&mut self, gpus: &[Vec<(u32, Option<u64>)>]) -> Vec<Vec<ForeignProcess>> {
        let now = Instant::now();
        if self.settled_at.is_none() && gpus.iter().any(|g| !g.is_empty()) {
            self.settled_at = Some(now + SETTLE);
        }
        let learning = self.settled_at.is_some_and(|t| now < t);
        gpus.iter()
            .map(|procs| {
                let mut out = Vec::new();
                for &(pid, mib) in procs {
                    if learning || self.job.contains(&pid) {
                        self.job.insert(pid);
                        continue;
                    }
                    match self.descends_from_job(pid) {
                        Some(true) | None => {
                            self.job.insert(pid);
                        }
                        Some(false) if out.len() < MAX_FOREIGN => {
                            out.push(ForeignProcess { pid, name: comm(pid), used_mib: mib });
                        }
                        Some(false) => {}
                    }
                }
                out
            })
            .collect()
    }

    /// Whether `pid` descends from one of the job's processes; None when its ancestry cannot be
    /// read.
    fn descends_from_job(&self, pid: u32) -> Option<bool> {
        let mut p = pid;
        for _ in 0..MAX_DEPTH {
            let parent = ppid(p)?;
            if self.job.contains(&parent) {
                return Some(true);
            }
            if parent <= 1 {
                return Some(false);
            }
            p = parent;
        }
        Some(false)
    }
}

/// The parent of `pid` from `/proc/PID/stat` (the field after the command, which may hold
/// spaces and parentheses: read after its last `)`).
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn comm(pid: u32) -> String {
    // `comm` holds at most 15 bytes; a quarter of the bound leaves room for any character.
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    name.trim_end().chars().filter(|c| !c.is_control()).take(MAX_NAME / 4).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_of_this_process_reads_and_a_stranger_is_foreign_after_learning() {
        let me = std::process::id();
        assert_eq!(ppid(me), Some(std::os::unix::process::parent_id()));
        let mut o = Owners::default();
        // Learning: whatever appears first is the job's.
        assert!(o.foreign(&[vec![(me, Some(10))]]).iter().all(Vec::is_empty));
        o.settled_at = Some(Instant::now());
        // This process stays the job's; its parent (not a descendant of it) is foreign.
        let parent = std::os::unix::process::parent_id();
        let found = o.foreign(&[vec![(me, None), (parent, Some(5))]]);
        assert_eq!(found[0].len(), 1);
        assert_eq!(found[0][0].pid, parent);
        // A process whose ancestry cannot be read is not called foreign.
        assert!(o.foreign(&[vec![(u32::MAX - 1, None)]])[0].is_empty());
    }
}
