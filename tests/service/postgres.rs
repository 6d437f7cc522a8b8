//! The service end to end on PostgreSQL (the SQLite runs are in flow.rs and
//! faults.rs): the 2-node pass, the service killed mid-run and restarted, and a node
//! without an agent.

use gpusanity_testkit::svc;

use std::time::Duration;

use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0";

#[test]
fn two_node_job_passes_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_pass");
    let mut w = World::new(Some(url), FAST);
    svc::two_node_pass(&mut w);
    w.shutdown();
}

#[test]
fn the_service_killed_mid_run_and_restarted_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_crash");
    let mut w = World::new(Some(url), "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0");
    svc::crash_restart(&mut w);
    w.shutdown();
}

#[test]
fn a_missing_agent_fails_the_run_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_missing");
    let mut w = World::new(Some(url), FAST);
    w.serve();
    let mut out = w.reader("check-events");
    w.publish(allocated("pg-miss", "job-pg", &["pg-ghost"], "").as_bytes());
    let failed = out.wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed");
    assert_eq!(failed["faulty_nodes"], serde_json::json!(["pg-ghost"]));
    assert_eq!(w.sql("SELECT code FROM findings"), ["NO_AGENT"]);
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckFailed"]);
    assert_eq!(w.sql("SELECT state FROM transitions ORDER BY id"), ["Checking", "CheckFailed"]);
    w.shutdown();
}

/// A commit that queues outbox rows wakes the publisher of another replica (another
/// connection pool on the same database, listening); a rolled-back insert does not.
#[test]
fn a_commit_that_queues_outbox_rows_wakes_every_replica_on_postgresql() {
    use std::sync::Arc;

    use gpusanity_db::{outbox, Db};
    use tokio::sync::Notify;

    let url = svc::postgres_database("outbox_wake");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (writer, listener) = (Db::connect(&url).await.expect("db"), Db::connect(&url).await.expect("db"));
        let wake = Arc::new(Notify::new());
        tokio::spawn({
            let wake = wake.clone();
            async move { listener.wake_on_outbox(wake).await }
        });
        // Woken once when the listening starts.
        tokio::time::timeout(Duration::from_secs(10), wake.notified()).await.expect("listening");
        let queue = |id: &'static str, commit: bool| {
            let writer = writer.clone();
            async move {
                let mut tx = writer.begin().await.expect("begin");
                outbox::enqueue_raw(&mut tx, "t", "k", id, "{}").await.expect("enqueue");
                if commit {
                    tx.commit().await.expect("commit");
                } else {
                    tx.rollback().await.expect("rollback");
                }
            }
        };
        queue("rolled-back", false).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(500), wake.notified()).await.is_err(),
            "a rolled-back insert woke the publisher"
        );
        let start = std::time::Instant::now();
        queue("committed", true).await;
        tokio::time::timeout(Duration::from_secs(2), wake.notified()).await.expect("no wake after the commit");
        eprintln!("outbox wake across replicas: {:?} after the commit began", start.elapsed());
    });
}
