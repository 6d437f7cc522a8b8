//! Run ownership among replicas (docs/service.md, "Several replicas"): this replica renews the
//! leases of the runs it holds, takes over the runs whose lease ran out in the job-events
//! partitions the consumer group gave it, gives up the runs of partitions it lost, and stops
//! acting on any run whose lease it could not renew in time (a database away): another replica
//! takes those over, and the fence keeps this one from ending them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use gpusanity_db::lease::Fence;
use gpusanity_db::rows::ServiceRunState;
use rdkafka::consumer::Consumer;

use super::Coordinator;

/// This replica's name and how long its hold on a run lasts without renewal.
#[derive(Debug, Clone)]
pub struct Replica {
    pub id: String,
    pub lease: Duration,
}

impl Replica {
    pub fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// The `lease_until` of a lease taken or renewed now.
    pub fn until(&self) -> i64 {
        gpusanity_db::now_ms().saturating_add(self.lease_ms())
    }

    /// How often leases are renewed and runs claimed.
    pub fn period(&self) -> Duration {
        self.lease / 5
    }

    /// Until when a lease renewed at `at` may be acted on: its end less a margin for the time
    /// one action takes (a run's end is one transaction).
    pub fn trusted_until(&self, at: Instant) -> Instant {
        at + self.lease - self.lease / 5
    }
}

/// What the lease keeper remembers between rounds.
#[derive(Debug, Default)]
pub struct LeaseState {
    /// When each job-events partition was first seen missing from this replica's assignment.
    absent_since: HashMap<i32, Instant>,
    /// The partitions of the last assignment read.
    assigned: HashSet<i32>,
    pub last: Option<Instant>,
}

impl Coordinator {
    /// One round: drop what may no longer be acted on, renew, give up lost partitions' runs,
    /// take over the runs this replica may take.
    pub(super) async fn leases(&mut self) -> Result<()> {
        let now = Instant::now();
        // Leases not renewed in time (the database away): hands off, without cancelling
        // anything (the agents go on; whoever takes the run over asks them again).
        let expired: Vec<String> =
            self.active.iter().filter(|(_, a)| a.trusted_until <= now).map(|(id, _)| id.clone()).collect();
        for id in expired {
            tracing::warn!(run_id = id, "the run's lease could not be renewed in time: left to another replica");
            self.active.remove(&id);
        }
        self.read_assignment(now);
        // A partition missing while the broker cannot be heard is no evidence of a rebalance:
        // the absence counts from when it can.
        if self.hearing.blind() {
            self.lease_state.absent_since.clear();
        }
        let started = Instant::now();
        let held: Vec<(String, i64)> = self.active.iter().map(|(id, a)| (id.clone(), a.fence.token)).collect();
        let kept: HashSet<String> =
            self.db.renew_runs(&self.replica.id, &held, self.replica.until()).await?.into_iter().collect();
        for (id, _) in held {
            if kept.contains(&id) {
                if let Some(a) = self.active.get_mut(&id) {
                    a.trusted_until = self.replica.trusted_until(started);
                }
                continue;
            }
            let Some(a) = self.active.remove(&id) else { continue };
            match self.db.get_run(&id).await? {
                Some(r) if r.state == ServiceRunState::Checking && !r.held => {
                    tracing::warn!(run_id = id, "the run was taken over by another replica: left to it");
                }
                _ => {
                    tracing::info!(run_id = id, "the run ended elsewhere (its job stopped): its agents are cancelled");
                    self.cancel_agents(&a, "the run ended");
                }
            }
        }
        self.release_lost_partitions(now).await?;
        let partitions: Vec<i32> = self.lease_state.assigned.iter().copied().collect();
        self.claim(false, &partitions).await
    }

    /// Takes the runs this replica may take now (with `own`, also those recorded as its own:
    /// at start-up, after a restart).
    pub(super) async fn claim(&mut self, own: bool, partitions: &[i32]) -> Result<()> {
        let started = Instant::now();
        let stale = self.replica.lease_ms().saturating_mul(2);
        let now = gpusanity_db::now_ms();
        let taken = self.db.claim_runs(&self.replica.id, own, partitions, now, self.replica.until(), stale).await?;
        for (run, fence, partition) in taken {
            if self.active.contains_key(&run.run_id) {
                continue;
            }
            tracing::info!(run_id = run.run_id, fence = fence.token, "taking up a run left in Checking");
            crate::ops::metrics::METRICS.runs_taken_over.inc();
            let until = self.replica.trusted_until(started);
            self.admit(run, fence, partition, until);
        }
        Ok(())
    }

    /// Claims at once what this replica may take in its partitions (a re-check just stored by
    /// a run's end), rather than at the next lease round.
    pub(super) async fn claim_now(&mut self) -> Result<()> {
        let partitions: Vec<i32> = self.lease_state.assigned.iter().copied().collect();
        self.claim(false, &partitions).await
    }

    fn read_assignment(&mut self, now: Instant) {
        let Some(events) = &self.events else { return };
        let Ok(list) = events.assignment() else { return };
        let assigned: HashSet<i32> =
            list.elements_for_topic(&self.topics.job_events).iter().map(|e| e.partition()).collect();
        let st = &mut self.lease_state;
        for p in &assigned {
            st.absent_since.remove(p);
        }
        for p in st.assigned.difference(&assigned) {
            st.absent_since.entry(*p).or_insert(now);
        }
        st.assigned = assigned;
    }

    /// Gives up the runs of partitions missing from the assignment for half a lease (a
    /// rebalance gave them to another replica), so that replica takes them at once.
    async fn release_lost_partitions(&mut self, now: Instant) -> Result<()> {
        let grace = self.replica.lease / 2;
        let lost: HashSet<i32> = self
            .lease_state
            .absent_since
            .iter()
            .filter(|(p, t)| now.duration_since(**t) > grace && !self.lease_state.assigned.contains(p))
            .map(|(p, _)| *p)
            .collect();
        if lost.is_empty() {
            return Ok(());
        }
        let ids: Vec<(String, Fence)> = self
            .active
            .iter()
            .filter(|(_, a)| a.partition.is_some_and(|p| lost.contains(&p)))
            .map(|(id, a)| (id.clone(), a.fence.clone()))
            .collect();
        for (id, fence) in ids {
            self.db.release_run(&id, &fence).await?;
            self.active.remove(&id);
            tracing::info!(run_id = id, "its job-events partition went to another replica: the run is handed over");
        }
        for p in lost {
            self.lease_state.absent_since.remove(&p);
        }
        Ok(())
    }
}
