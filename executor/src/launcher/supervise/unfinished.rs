//! What a rank that did not finish a check reports: not run, timed out or failed, with its last
//! progress, heartbeat age, exit status and exit time (for crash and hang attribution).

use std::process::ExitStatus;
use std::time::Instant;

use gpusanity_common::report::{CheckStatus, RankResult};
use nix::sys::signal::Signal;

use super::{Rank, Stop};

/// The result of a rank that did not finish check `k`.
pub(super) fn unfinished(r: &Rank, k: usize, stage: usize, stop: Option<&Stop>, now: Instant) -> RankResult {
    // Checks after the one running when the run stopped never started.
    let running = stage.saturating_sub(1);
    if k > running || (stage == 0 && k > 0) {
        let mut res = RankResult::new(r.spec.rank, CheckStatus::NotRun);
        res.notes.insert("reason".into(), "the run stopped before this check".into());
        return res;
    }
    // A worker that ended while another node was stopping the run was not the cause.
    let own_failure = matches!(stop, Some(Stop::RankFailed { rank, .. }) if *rank == r.spec.rank);
    if r.exited.is_some() && !own_failure {
        let mut res = RankResult::new(r.spec.rank, CheckStatus::NotRun);
        res.notes.insert("stopped".into(), "ended while the run was being stopped".into());
        if let Some(e) = &r.exited {
            res.notes.insert("exit".into(), e.clone());
        }
        return res;
    }
    let status = match stop {
        Some(s) if s.is_timeout() => CheckStatus::TimedOut,
        Some(Stop::RankFailed { rank, .. }) if *rank == r.spec.rank => CheckStatus::Error,
        _ => CheckStatus::NotRun,
    };
    let mut res = RankResult::new(r.spec.rank, status);
    res.metrics.insert("heartbeat_age_s".into(), now.duration_since(r.last_beat).as_secs_f64());
    res.metrics.insert("progress_seq".into(), r.progress_seq as f64);
    if let Some((check, phase, step)) = &r.progress {
        res.notes.insert("last_progress".into(), format!("{check} {phase} {step}"));
    }
    match stop {
        Some(Stop::RankFailed { rank, reason, .. }) if *rank == r.spec.rank => {
            res.error = Some(reason.clone());
            if let Some(e) = &r.exited {
                res.notes.insert("exit".into(), e.clone());
            }
            if let Some(ms) = r.exited_at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()) {
                res.metrics.insert("exit_unix_ms".into(), ms.as_millis() as f64);
            }
        }
        Some(Stop::RankFailed { rank, .. }) => {
            res.notes.insert("stopped".into(), format!("stopped after rank {rank} failed"));
        }
        Some(Stop::Interrupted { signal, .. }) => {
            res.notes.insert("stopped".into(), format!("interrupted ({signal})"));
        }
        _ => {}
    }
    res
}

pub(super) fn describe_exit(status: &std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(sig)) => {
                let name = Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| sig.to_string());
                format!("killed by signal {name}")
            }
            _ => "ended".into(),
        },
        Err(e) => format!("could not be waited for: {e}"),
    }
}
