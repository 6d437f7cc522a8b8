//! How each job event changes the database: an allocation or a restart (the job stored, its
//! run in Checking superseded, then a new run started or the check skipped), a stop (the run
//! cancelled). Called by [`crate::consume`] inside the batch's transaction.

use gpusanity_common::wire::job::{Allocation, JobEvent, JobNode, RestartReason};
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_common::Settings;
use gpusanity_db::rows::{JobRow, RunRow, ServiceRunState};
use gpusanity_db::runs;
use gpusanity_db::{now_ms, outbox, watch, Tx};

use crate::consume::{output_event, Applied, Ingest};
use crate::policy::{self, Decision, Start};
use crate::validate::{self, Reject};
use crate::Notice;

/// An allocation as the policy sees it ([`Ingest::plan_allocation`]).
pub(crate) struct Plan {
    pub job: JobRow,
    pub settings: Settings,
    pub decision: Decision,
}

/// The `CheckSkipped` output event of a job event that needs no check.
pub(crate) fn skipped_event(ev: &JobEvent, job: &JobRow, reason: &str) -> OutputEvent {
    output_event(&job.job_id, &job.workspace_id, None, &ev.event_id, OutputBody::CheckSkipped { reason: reason.into() })
}

/// The decision recorded with a skipped job event.
pub(crate) fn skip_decision(reason: &str) -> String {
    format!("skipped: {reason}")
}

impl Ingest {
    /// What an allocation asks for, before the database is read: the job as it is stored, its
    /// validated settings and the policy's decision (a run or a skip).
    pub(crate) fn plan_allocation(&self, ev: &JobEvent, a: &Allocation) -> Result<Plan, Reject> {
        let settings = if a.settings.enable_sanity_check {
            let s = validate::settings(&a.settings.sanity_check_args)?;
            self.env_policy.check(&s.envs).map_err(|e| Reject::BadSettings(e.to_string()))?;
            s
        } else {
            Settings::default()
        };
        let job = JobRow {
            job_id: ev.job_id.clone(),
            workspace_id: ev.workspace_id.clone(),
            attempt: i64::from(a.attempt),
            framework: a.framework.clone(),
            nodes: a.nodes.clone(),
            enable_check: a.settings.enable_sanity_check,
            check_args: a.settings.sanity_check_args.clone(),
        };
        let decision = policy::decide(
            a.framework.as_deref(),
            &a.nodes,
            a.settings.enable_sanity_check,
            &settings,
            &Start::Allocated,
        );
        Ok(Plan { job, settings, decision })
    }

    pub(crate) async fn allocated(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        a: &Allocation,
        notices: &mut Vec<Notice>,
    ) -> Applied<Result<String, Reject>> {
        let plan = match self.plan_allocation(ev, a) {
            Ok(p) => p,
            Err(r) => return Ok(Err(r)),
        };
        runs::upsert_job(tx, &plan.job).await?;
        self.cancel_active(tx, ev, "superseded by a new allocation of the job", notices).await?;
        Ok(Ok(self.start_or_skip(tx, ev, &plan.job, &plan.settings, plan.decision, notices).await?))
    }

    pub(crate) async fn restarted(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        attempt: u32,
        reason: &RestartReason,
        nodes: Option<&[JobNode]>,
        notices: &mut Vec<Notice>,
    ) -> Applied<Result<String, Reject>> {
        let Some(mut job) = runs::get_job(tx, &ev.job_id).await? else {
            return Ok(Err(Reject::UnknownJob(ev.job_id.clone())));
        };
        job.attempt = i64::from(attempt);
        if let Some(n) = nodes {
            job.nodes = n.to_vec();
        }
        runs::upsert_job(tx, &job).await?;
        // Stored settings were validated when the job was allocated.
        let settings = if job.enable_check {
            validate::settings(&job.check_args).unwrap_or_default()
        } else {
            Settings::default()
        };
        self.cancel_active(tx, ev, "superseded by a restart of the job", notices).await?;
        let mut d = policy::decide(
            job.framework.as_deref(),
            &job.nodes,
            job.enable_check,
            &settings,
            &Start::Restarted(reason),
        );
        if let Decision::Skip(why) = &d {
            if self.check_suspected_at_restart
                && job.enable_check
                && watch::suspected_in_latest_run(tx, &job.job_id).await?
            {
                tracing::info!(
                    job_id = job.job_id,
                    "checked although {why}: the watch suspected a node while the job ran"
                );
                d = Decision::Run;
            }
        }
        Ok(Ok(self.start_or_skip(tx, ev, &job, &settings, d, notices).await?))
    }

    pub(crate) async fn stopped(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        reason: &str,
        notices: &mut Vec<Notice>,
    ) -> Applied<String> {
        runs::mark_job_stopped(tx, &ev.job_id).await?;
        let why = if reason.is_empty() {
            "the job was stopped".to_string()
        } else {
            format!("the job was stopped: {reason}")
        };
        Ok(match self.cancel_active(tx, ev, &why, notices).await? {
            Some(run_id) => format!("cancelled run {run_id}"),
            None => "no run to cancel".into(),
        })
    }

    /// Cancels the job's run in `Checking`, if any.
    async fn cancel_active(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        reason: &str,
        notices: &mut Vec<Notice>,
    ) -> Applied<Option<String>> {
        let Some(run) = runs::active_run_of_job(tx, &ev.job_id).await? else { return Ok(None) };
        if runs::finish_run(tx, &run.run_id, ServiceRunState::CheckCancelled, reason, None, None).await? {
            let out = output_event(
                &run.job_id,
                &run.workspace_id,
                Some(&run.run_id),
                &ev.event_id,
                OutputBody::CheckCancelled { reason: reason.into() },
            );
            outbox::enqueue(tx, &self.topics.output, &out).await?;
            notices.push(Notice::Cancelled { run_id: run.run_id.clone(), reason: reason.into() });
        }
        Ok(Some(run.run_id))
    }

    async fn start_or_skip(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        job: &JobRow,
        settings: &Settings,
        d: Decision,
        notices: &mut Vec<Notice>,
    ) -> Applied<String> {
        match d {
            Decision::Skip(reason) => {
                outbox::enqueue(tx, &self.topics.output, &skipped_event(ev, job, &reason)).await?;
                Ok(skip_decision(&reason))
            }
            Decision::Run => {
                let now = now_ms();
                let run = RunRow {
                    run_id: uuid::Uuid::new_v4().to_string(),
                    job_id: job.job_id.clone(),
                    workspace_id: job.workspace_id.clone(),
                    attempt: job.attempt,
                    cause_event_id: ev.event_id.clone(),
                    nodes: job.nodes.clone(),
                    check_args: job.check_args.clone(),
                    settings: serde_json::to_value(settings)?,
                    state: ServiceRunState::Checking,
                    held: false,
                    created_at: now,
                    deadline_at: now + (settings.max_time_minutes * 60_000.0) as i64,
                    finished_at: None,
                    summary: String::new(),
                };
                runs::insert_run(tx, &run).await?;
                let body = OutputBody::SanityCheckStarted {
                    attempt: u32::try_from(job.attempt).unwrap_or(u32::MAX),
                    nodes: job.nodes.iter().map(|n| n.name.clone()).collect(),
                    checks: settings.selected_checks(),
                };
                outbox::enqueue(
                    tx,
                    &self.topics.output,
                    &output_event(&job.job_id, &job.workspace_id, Some(&run.run_id), &ev.event_id, body),
                )
                .await?;
                notices.push(Notice::Start(run.run_id.clone()));
                Ok(format!("run {}", run.run_id))
            }
        }
    }
}
