//! The coordinator's loop: notices from the ingest, agent reports, the clock. A database or
//! Kafka outage never ends it: what failed is retried after a backoff (a run stays active
//! until its end is stored; a report's offset is stored only after it was handled).

use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_bus::kafka::ReadErrors;
use gpusanity_bus::signals::SIGNALS;
use rdkafka::message::Message;
use tokio::sync::mpsc;

use super::*;

impl Coordinator {
    /// Runs until the notices channel closes.
    pub async fn run(
        mut self,
        mut notices: mpsc::UnboundedReceiver<Notice>,
        reports: Arc<StreamConsumer>,
        events: Arc<StreamConsumer>,
    ) -> Result<()> {
        self.events = Some(events);
        self.baseline = super::baseline::spawn(self.db.clone(), &self.config.fleet);
        self.hearing = super::hearing::Hearing::new(super::hearing::spawn_probe(
            reports.clone(),
            self.topics.agent_reports.clone(),
        ));
        self.lease_state.last = Some(Instant::now());
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Backoff::default();
        let mut read_errors = ReadErrors::new("agent reports");
        loop {
            let done: Result<()> = tokio::select! {
                n = notices.recv() => match n {
                    Some(n) => {
                        self.notice(n).await;
                        Ok(())
                    }
                    None => return Ok(()),
                },
                m = reports.recv() => match m {
                    Ok(m) => {
                        read_errors.message();
                        let handled = match m.payload().and_then(|p| self.authentic(p)) {
                            Some(r) => self.report_or_dead_letter(&m, r).await,
                            None => Ok(()),
                        };
                        if handled.is_ok() {
                            if let Err(e) = reports.store_offset(m.topic(), m.partition(), m.offset()) {
                                SIGNALS.kafka_error();
                                tracing::warn!("storing an agent report's offset: {e}");
                            }
                        }
                        handled
                    }
                    // Consumer errors are transient (librdkafka reconnects); the tick goes on.
                    Err(e) => {
                        read_errors.error(&e);
                        Ok(())
                    }
                },
                _ = tick.tick() => {
                    crate::ops::metrics::METRICS
                        .agents_live
                        .set(i64::try_from(self.agents.live_count(self.config.agent_timeout(), &self.hearing)).unwrap_or(i64::MAX));
                    self.tick().await
                }
                _ = tokio::time::sleep_until(self.next_lease_round()) => {
                    self.lease_state.last = Some(Instant::now());
                    let r = self.leases().await;
                    crate::ops::metrics::METRICS.runs_owned.set(i64::try_from(self.active.len()).unwrap_or(i64::MAX));
                    r
                }
            };
            match done {
                Ok(()) => backoff = Backoff::default(),
                Err(e) => {
                    SIGNALS.db_error();
                    let wait = backoff.wait().await;
                    tracing::warn!("coordinator: {e:#}; retried after {wait:?}");
                }
            }
        }
    }

    /// When the next lease round is due.
    fn next_lease_round(&self) -> tokio::time::Instant {
        let last = self.lease_state.last.unwrap_or_else(Instant::now);
        tokio::time::Instant::from_std(last + self.replica.period())
    }

    /// A notice from the ingest; a new run is read from the database, through an outage.
    async fn notice(&mut self, n: Notice) {
        match n {
            Notice::Start(run_id) => {
                // The run and the hold the ingest gave this replica in the run's transaction.
                let mut backoff = Backoff::default();
                let (run, held) = loop {
                    match (self.db.get_run(&run_id).await, self.db.fence_of(&run_id).await) {
                        (Ok(r), Ok(h)) => break (r, h),
                        (Err(e), _) | (_, Err(e)) => {
                            SIGNALS.db_error();
                            let wait = backoff.wait().await;
                            tracing::warn!(run_id, "reading a new run failed, retried after {wait:?}: {e}");
                        }
                    }
                };
                if let (Some(run), Some((fence, partition))) = (run, held) {
                    if fence.owner != self.replica.id {
                        return;
                    }
                    let until = self.replica.trusted_until(Instant::now());
                    self.admit(run, fence, partition, until);
                    if let Err(e) = self.tick().await {
                        tracing::warn!("coordinator: {e:#}; retried at the next tick");
                    }
                }
            }
            Notice::Cancelled { run_id, reason } => {
                if let Some(a) = self.active.remove(&run_id) {
                    self.cancel_agents(&a, &reason);
                }
            }
        }
    }
}
