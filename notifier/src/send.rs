//! The sender: every due delivery in a task of its own, under its own timeout, each attempt
//! logged, retried with exponential backoff and jitter up to `max_attempts`, then failed.
//!
//! Nothing else waits on it: a dead endpoint holds one task (at most `concurrency` in flight)
//! while the others go on, and the coordinator and the publisher never wait on the notifier.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpusanity_common::wire::output::OutputEvent;
use gpusanity_db::deliveries::{Due, Outcome};
use gpusanity_db::{now_ms, Db, DbError};
use rand::Rng;
use tokio::sync::{Notify, Semaphore};

use crate::config::NotifierConfig;
use crate::email::{Mailed, Mailer};
use crate::guard::Policy;
use crate::notice::Notice;
use crate::target::Target;
use crate::webhook::{self, Sent};

pub struct Sender {
    pub db: Db,
    pub config: NotifierConfig,
    pub report_url: String,
    pub client: reqwest::Client,
    /// Where webhooks may go (checked again on every attempt: the allowlist may have changed).
    pub policy: Arc<Policy>,
    pub mailer: Option<Mailer>,
    pub wake: Arc<Notify>,
    /// Deliveries being sent now, and those just recorded; kept across a restart of
    /// [`Sender::run`] so none is sent twice at once.
    pub inflight: Arc<Mutex<Claims>>,
    pub slots: Arc<Semaphore>,
    /// This replica's name: a delivery is claimed in the database by one replica before it
    /// is attempted, so several replicas never attempt one delivery at once.
    pub holder: String,
}

/// The delay before retry `attempt` (1-based): base * 2^(attempt-1), capped, +-25 % jitter.
pub fn backoff(c: &NotifierConfig, attempt: u32) -> Duration {
    let exp = c.backoff_base_s * 2f64.powi(attempt.saturating_sub(1).min(30) as i32);
    let capped = exp.min(c.backoff_max_s);
    let jitter = rand::rng().random_range(0.75..=1.25);
    Duration::from_secs_f64(capped * jitter)
}

/// What one try came to, before it is logged.
/// Which deliveries this process is sending, and the attempt counts it recorded last.
///
/// A query for due deliveries can read a row as it was before an attempt that ended while the
/// query ran (still pending, its old `next_at`): by the time the row comes back the attempt is
/// no longer in flight. `recorded` tells such a stale row (fewer attempts than recorded) from a
/// retry that is really due, so a failed attempt is never repeated at once, without its backoff.
#[derive(Debug, Default)]
pub struct Claims {
    inflight: HashSet<i64>,
    recorded: HashMap<i64, (i64, Instant)>,
}

/// A stale row can only come from a query that started before the attempt was recorded; a
/// record older than this cannot be raced any more.
const RECORD_KEPT: Duration = Duration::from_secs(60);

impl Claims {
    /// Claims `d` for one attempt: false if it is in flight or the row is stale.
    fn claim(&mut self, d: &Due) -> bool {
        if self.recorded.get(&d.id).is_some_and(|(attempts, _)| d.attempts < *attempts) {
            return false;
        }
        self.inflight.insert(d.id)
    }

    /// The attempt ended with `attempts` recorded (or failed to record: `None`).
    fn release(&mut self, id: i64, attempts: Option<i64>) {
        self.inflight.remove(&id);
        if let Some(a) = attempts {
            self.recorded.insert(id, (a, Instant::now()));
        }
        self.recorded.retain(|_, (_, at)| at.elapsed() < RECORD_KEPT);
    }

    fn busy(&self) -> usize {
        self.inflight.len()
    }
}

enum Tried {
    Ok(Option<u16>),
    Retry(Option<u16>, String),
    GiveUp(Option<u16>, String),
}

impl Sender {
    /// Sends until the process ends; database errors end it (the caller restarts it).
    pub async fn run(self: Arc<Self>) -> Result<(), DbError> {
        let (inflight, slots) = (&self.inflight, &self.slots);
        loop {
            let free = slots.available_permits() as i64;
            if free > 0 {
                let busy = inflight.lock().map(|s| s.busy()).unwrap_or(0) as i64;
                for d in self.db.due_deliveries(free + busy).await? {
                    let fresh = inflight.lock().map(|mut s| s.claim(&d)).unwrap_or(false);
                    if !fresh {
                        continue;
                    }
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        if let Ok(mut s) = inflight.lock() {
                            s.release(d.id, None);
                        }
                        break;
                    };
                    let (me, inflight) = (self.clone(), inflight.clone());
                    tokio::spawn(async move {
                        let (id, attempts) = (d.id, d.attempts + 1);
                        let claimed = me.db.claim_delivery(&d, &me.holder, me.claim_ms()).await;
                        if !matches!(claimed, Ok(true)) {
                            // Another replica took it (or the database is away): not ours now.
                            if let Ok(mut s) = inflight.lock() {
                                s.release(id, None);
                            }
                            drop(permit);
                            return;
                        }
                        let recorded = match me.deliver(d).await {
                            Ok(()) => Some(attempts),
                            Err(e) => {
                                tracing::error!(
                                    delivery = id,
                                    "recording a delivery attempt failed, it will be tried again: {e}"
                                );
                                None
                            }
                        };
                        if let Ok(mut s) = inflight.lock() {
                            s.release(id, recorded);
                        }
                        drop(permit);
                        me.wake.notify_one();
                    });
                }
            }
            // Woken by the planner and by finished deliveries; the timeout catches retries coming due.
            let _ = tokio::time::timeout(Duration::from_millis(100), self.wake.notified()).await;
        }
    }

    /// How long a claim on a delivery lasts: past every timeout of one attempt, so it lapses
    /// only when its replica died during the attempt (then another replica tries again).
    fn claim_ms(&self) -> i64 {
        let longest = self.config.webhook_timeout_s.max(self.config.email_timeout_s);
        (longest * 2000.0) as i64 + 10_000
    }

    /// One attempt of one delivery, logged with its outcome.
    async fn deliver(&self, d: Due) -> Result<(), DbError> {
        let started = Instant::now();
        let tried = self.attempt(&d).await;
        let attempt = d.attempts as u32 + 1;
        let took_ms = started.elapsed().as_millis() as i64;
        let (ok, code, error, status, next_at) = match tried {
            Tried::Ok(code) => (true, code, None, "sent", now_ms()),
            Tried::Retry(code, e) if attempt < self.config.max_attempts => {
                let wait = backoff(&self.config, attempt);
                tracing::warn!(
                    delivery = d.id,
                    key = d.key,
                    attempt,
                    "delivery failed, retrying in {:.1} s: {e}",
                    wait.as_secs_f64()
                );
                (false, code, Some(e), "pending", now_ms() + wait.as_millis() as i64)
            }
            Tried::Retry(code, e) => {
                tracing::error!(delivery = d.id, key = d.key, attempt, "delivery failed for the last time: {e}");
                (false, code, Some(e), "failed", now_ms())
            }
            Tried::GiveUp(code, e) => {
                tracing::error!(
                    delivery = d.id,
                    key = d.key,
                    attempt,
                    "delivery failed and a retry would not help, giving up: {e}"
                );
                (false, code, Some(e), "failed", now_ms())
            }
        };
        let o = Outcome { ok, status_code: code.map(i64::from), error, took_ms, status, next_at };
        self.db.record_attempt(&d, &o).await
    }

    async fn attempt(&self, d: &Due) -> Tried {
        let Some(target) = Target::from_json(&d.channel, &d.target) else {
            return Tried::GiveUp(None, format!("stored target of channel `{}` is malformed", d.channel));
        };
        let ev: OutputEvent = match serde_json::from_str(&d.event) {
            Ok(ev) => ev,
            Err(e) => return Tried::GiveUp(None, format!("stored event is malformed: {e}")),
        };
        let n = Notice::from_event(&ev, &self.report_url);
        match target {
            Target::Webhook { url, format, secret } => {
                let body = webhook::body(format, &n, &ev, &d.key);
                let (url, body) = webhook::platform_signed(format, &url, secret.as_deref(), body, now_ms());
                let limit = Duration::from_secs_f64(self.config.webhook_timeout_s);
                // reqwest's own timeout covers the request; this one also covers a stuck DNS lookup.
                let sent = tokio::time::timeout(
                    limit,
                    webhook::post(
                        &self.client,
                        &self.policy,
                        &url,
                        secret.as_deref(),
                        &d.key,
                        n.event_type,
                        &body,
                        limit,
                    ),
                )
                .await;
                match sent {
                    Ok(Sent::Ok(code)) => Tried::Ok(Some(code)),
                    Ok(Sent::Retry(code, e)) => Tried::Retry(code, e),
                    Ok(Sent::GiveUp(code, e)) => Tried::GiveUp(code, e),
                    Err(_) => Tried::Retry(None, format!("no answer within {:.1} s", limit.as_secs_f64())),
                }
            }
            Target::Email { to } => {
                let Some(m) = &self.mailer else {
                    return Tried::GiveUp(None, "no SMTP server configured (notifier.smtp.host)".into());
                };
                let limit = Duration::from_secs_f64(self.config.email_timeout_s);
                match tokio::time::timeout(limit, m.send(&n, &to, &d.key)).await {
                    Ok(Mailed::Ok) => Tried::Ok(None),
                    Ok(Mailed::Retry(e)) => Tried::Retry(None, e),
                    Ok(Mailed::GiveUp(e)) => Tried::GiveUp(None, e),
                    Err(_) => Tried::Retry(None, format!("SMTP did not finish within {:.1} s", limit.as_secs_f64())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_read_before_its_attempt_was_recorded_is_not_sent_again() {
        let due = |attempts| Due {
            id: 7,
            key: "k".into(),
            channel: "webhook".into(),
            target: "{}".into(),
            event: "{}".into(),
            attempts,
        };
        let mut c = Claims::default();
        assert!(c.claim(&due(0)));
        assert!(!c.claim(&due(0)), "in flight");
        c.release(7, Some(1));
        assert!(!c.claim(&due(0)), "a stale row of the first attempt");
        assert!(c.claim(&due(1)), "the retry, once due");
        c.release(7, None);
        assert!(c.claim(&due(1)), "an attempt that was not recorded is tried again");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let c = NotifierConfig { backoff_base_s: 1.0, backoff_max_s: 10.0, ..NotifierConfig::default() };
        for (attempt, nominal) in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (40, 10.0)] {
            let d = backoff(&c, attempt).as_secs_f64();
            assert!(d >= nominal * 0.75 - 1e-9 && d <= nominal * 1.25 + 1e-9, "attempt {attempt}: {d}");
        }
        let spread: HashSet<u128> = (0..20).map(|_| backoff(&c, 3).as_micros()).collect();
        assert!(spread.len() > 1, "no jitter");
    }
}
