//! What a rank that did not finish a check reports: not run, timed out or failed, with its last
//! progress, heartbeat age, exit status and exit time (for crash and hang attribution).

use std::process::ExitStatus;
use std::time::Instant;

use gpusanity_common::rank_end::RankEnd;
use gpusanity_common::report::{CheckStatus, RankResult};
use nix::sys::signal::Signal;

use super::Rank;
use crate::launcher::outcome::Stop;

/// The result of a rank that did not finish check `k`.
pub(super) fn unfinished(r: &Rank, k: usize, stage: usize, stop: Option<&Stop>, now: Instant) -> RankResult {
    // Checks after the one running when the run stopped never started.
    let running = stage.saturating_sub(1);
    if k > running || (stage == 0 && k > 0) {
        let mut res = RankResult::new(r.spec.place.rank, CheckStatus::NotRun);
        res.notes.insert("reason".into(), "the run stopped before this check".into());
        return res;
    }
    // A worker that ended while another node was stopping the run was not the cause.
    let own_failure = matches!(stop, Some(Stop::RankFailed { rank, .. }) if *rank == r.spec.place.rank);
    if r.exited.is_some() && !own_failure {
        let mut res = RankResult::new(r.spec.place.rank, CheckStatus::NotRun);
        res.end = Some(Box::new(RankEnd {
            exit: r.exited.clone(),
            stopped: Some("ended while the run was being stopped".into()),
            ..RankEnd::default()
        }));
        return res;
    }
    let status = match stop {
        Some(s) if s.is_timeout() => CheckStatus::TimedOut,
        Some(Stop::RankFailed { rank, .. }) if *rank == r.spec.place.rank => CheckStatus::Error,
        _ => CheckStatus::NotRun,
    };
    let mut res = RankResult::new(r.spec.place.rank, status);
    let mut end = RankEnd {
        heartbeat_age_s: Some(now.duration_since(r.last_beat).as_secs_f64()),
        progress_seq: Some(r.progress_seq),
        last_progress: r.progress.as_ref().map(|(check, phase, step)| format!("{check} {phase} {step}")),
        ..RankEnd::default()
    };
    match stop {
        Some(Stop::RankFailed { rank, reason, .. }) if *rank == r.spec.place.rank => {
            res.error = Some(reason.clone());
            end.exit = r.exited.clone();
            end.exit_unix_ms = r
                .exited_at
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        Some(Stop::RankFailed { rank, .. }) => end.stopped = Some(format!("stopped after rank {rank} failed")),
        Some(Stop::Interrupted { signal, .. }) => end.stopped = Some(format!("interrupted ({signal})")),
        _ => {}
    }
    res.end = Some(Box::new(end));
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
