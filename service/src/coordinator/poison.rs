//! Agent reports that cannot be handled. A report whose names or text are malformed (a NUL, a
//! control character in a name, a name too long), or whose handling the database refuses (a
//! poison message: [`DbError::is_poison`]), goes to the dead-letter topic with the reason and
//! its offset is committed; a run it was the result of (sent by the agent holding that node of
//! the run) ends failed (`DATA_PLANE_ERROR`) rather than waiting for its deadline. While the database is away (an outage) the same report is
//! handled again after a backoff, and nothing is dead-lettered.

use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_common::report::{Code, Finding};
use gpusanity_common::verdict::{run_verdict, ServiceFacts, Stop};
use gpusanity_common::wire::agent::{AgentReport, ReportBody};
use gpusanity_db::rows::RunRow;
use gpusanity_db::{outbox, DbError};
use gpusanity_ingest::consume::dead_letter;
use gpusanity_ingest::validate;
use rdkafka::message::Message;

use super::finish::{finish, node_finding, Ending};
use super::Coordinator;

/// The database error behind `e`, if it is one.
fn db_error(e: &anyhow::Error) -> Option<&DbError> {
    e.chain().find_map(|c| c.downcast_ref::<DbError>())
}

impl Coordinator {
    /// Handles one agent report, read as `m`: node 0's chunked report joined, validated, then [`Coordinator::report`], retried
    /// through a database outage; a malformed or poison report becomes a dead letter.
    pub(super) async fn report_or_dead_letter(&mut self, m: &impl Message, mut r: AgentReport) -> Result<()> {
        self.join_report(&mut r);
        if let Err(reject) = validate::agent_report(&r) {
            return self.refuse(m, &r, &reject.to_string()).await;
        }
        let mut backoff = Backoff::default();
        loop {
            match self.report(r.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) => match db_error(&e) {
                    Some(db) if db.is_poison() => {
                        return self.refuse(m, &r, &format!("refused by the database: {db}")).await
                    }
                    Some(db) => {
                        let wait = backoff.wait().await;
                        tracing::warn!(node = r.node, "handling an agent report failed, retried after {wait:?}: {db}");
                    }
                    None => return Err(e),
                },
            }
        }
    }

    /// Dead-letters `r` with `reason` and ends the run it was the result of.
    async fn refuse(&mut self, m: &impl Message, r: &AgentReport, reason: &str) -> Result<()> {
        tracing::warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), "dead letter: {reason}");
        let dl = dead_letter(m.topic(), m.partition(), m.offset(), m.payload().unwrap_or_default(), reason);
        let payload = serde_json::to_string(&dl)?;
        let mut backoff = Backoff::default();
        loop {
            let queued: Result<(), DbError> = async {
                let mut tx = self.db.begin().await?;
                outbox::enqueue_raw(&mut tx, &self.topics.dead_letter, "dead-letter", &dl.event_id, &payload).await?;
                tx.commit().await?;
                Ok(())
            }
            .await;
            match queued {
                Ok(()) => break,
                Err(e) if e.is_poison() => {
                    tracing::error!("the dead letter itself was refused, dropping the report: {e}");
                    break;
                }
                Err(e) => {
                    let wait = backoff.wait().await;
                    tracing::warn!("queueing a dead letter failed, retried after {wait:?}: {e}");
                }
            }
        }
        self.outbox_wake.notify_one();
        let ReportBody::Result(res) = &r.body else { return Ok(()) };
        let k = res.node_rank;
        let Some(a) = self.active.get(&res.run_id) else { return Ok(()) };
        if !Self::holds(a, &r.node, &r.agent_id, k) {
            return Ok(());
        }
        let message = format!("the result of node {k} was refused: {reason}");
        let f = node_finding(&a.run, k, Code::DataPlaneError, message.clone());
        let run_id = res.run_id.clone();
        let mut backoff = Backoff::default();
        loop {
            match self.end(&run_id, Stop::DataPlane, &message, None, vec![f.clone()]).await {
                Ok(()) => return Ok(()),
                Err(e) => match db_error(&e) {
                    Some(db) if db.is_poison() => {
                        tracing::error!(run_id, "ending the run failed, it stays checking until a restart: {db}");
                        self.active.remove(&run_id);
                        return Ok(());
                    }
                    Some(db) => {
                        let wait = backoff.wait().await;
                        tracing::warn!(run_id, "ending a run failed, retried after {wait:?}: {db}");
                    }
                    None => return Err(e),
                },
            }
        }
    }

    /// [`finish`], and when the database refuses the report's data, the run ends failed
    /// without it, with a finding that says why.
    pub(super) async fn finish_checked(&self, run: &RunRow, end: Ending<'_>) -> Result<bool, DbError> {
        let with_report = end.report.is_some();
        let (fence, withheld, across, recheck) = (end.fence, end.withheld, end.across, end.recheck);
        match finish(&self.db, &self.topics, &self.config.report_url, run, end).await {
            Err(e) if e.is_poison() && with_report => {
                tracing::error!(run_id = run.run_id, "the run's report was refused, ending the run without it: {e}");
                let message = format!("node 0's report could not be stored: {e}");
                let f: Finding = node_finding(run, 0, Code::DataPlaneError, message.clone());
                let facts = ServiceFacts { own: std::slice::from_ref(&f), ..ServiceFacts::default() };
                let end = Ending {
                    verdict: run_verdict(None, facts),
                    summary: &message,
                    report: None,
                    extra: std::slice::from_ref(&f),
                    fence,
                    withheld,
                    across,
                    recheck,
                };
                finish(&self.db, &self.topics, &self.config.report_url, run, end).await
            }
            r => r,
        }
    }
}
