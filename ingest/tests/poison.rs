//! The consumer's batches against a real SQLite database: an event validation refuses, one the
//! database refuses (a trigger) and good ones in one batch; duplicates within a batch and
//! allocations needing no check (the multi-row path); and a database that is gone.

use std::sync::Arc;

use gpusanity_common::wire::Topics;
use gpusanity_db::Db;
use gpusanity_ingest::consume::Ingest;
use rdkafka::message::{OwnedMessage, Timestamp};
use sqlx::{AnyPool, Row};
use tokio::sync::{mpsc, Notify};

fn event(event_id: &str, job: &str) -> String {
    serde_json::json!({
        "version": 1, "type": "JobResourcesAllocated", "event_id": event_id, "job_id": job, "workspace_id": "ws",
        "attempt": 0, "nodes": [{"name": "n1", "address": "127.0.0.1", "gpus": 1}],
        "settings": {"EnableSanityCheck": true, "SanityCheckArgs": ""}
    })
    .to_string()
}

/// An allocation that needs no check (EnableSanityCheck off).
fn unchecked(event_id: &str, job: &str) -> String {
    event(event_id, job).replace(r#""EnableSanityCheck":true"#, r#""EnableSanityCheck":false"#)
}

fn message(offset: i64, payload: &str) -> OwnedMessage {
    let payload = Some(payload.as_bytes().to_vec());
    OwnedMessage::new(payload, None, "job-events".into(), Timestamp::NotAvailable, 0, offset, None)
}

/// The consumer under test, and a connection pool of the test's own on its database (for
/// the SQL that looks at the result).
struct Fixture {
    ing: Ingest,
    sql: AnyPool,
}

async fn ingest(dir: &tempfile::TempDir) -> Fixture {
    ingest_on(&format!("sqlite://{}", dir.path().join("t.db").display())).await
}

async fn ingest_on(url: &str) -> Fixture {
    let db = Db::connect(url).await.expect("db");
    let sql = AnyPool::connect(url).await.expect("a pool of the test's own");
    let (notices, _) = mpsc::unbounded_channel();
    let ing = Ingest {
        db,
        topics: Topics::default(),
        notices,
        outbox_wake: Arc::new(Notify::new()),
        env_policy: Default::default(),
        owner: gpusanity_ingest::consume::Owner { id: "test".into(), lease: std::time::Duration::from_secs(10) },
        check_suspected_at_restart: false,
    };
    Fixture { ing, sql }
}

async fn column(sql: &AnyPool, q: &str) -> Vec<String> {
    let rows = sqlx::query(q).fetch_all(sql).await.expect("query");
    rows.iter().map(|r| r.try_get::<String, _>(0).expect("text")).collect()
}

#[tokio::test]
async fn only_the_refused_events_of_a_batch_become_dead_letters() {
    let dir = tempfile::tempdir().expect("dir");
    let Fixture { ing, sql } = ingest(&dir).await;
    sqlx::query(
        "CREATE TRIGGER refuse BEFORE INSERT ON jobs WHEN NEW.job_id LIKE '%refuse-me%' \
         BEGIN SELECT RAISE(ABORT, 'a test trigger refused the row'); END",
    )
    .execute(&sql)
    .await
    .expect("trigger");
    let batch = [
        message(0, &event("e0", "job-a")),
        message(1, &event("e1", "job\u{0}b")),
        message(2, &event("e2", "job-refuse-me")),
        message(3, &event("e3", "job-c")),
    ];
    let notices = ing.apply_batch(&batch).await.expect("applied");
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert_eq!(column(&sql, "SELECT job_id FROM jobs ORDER BY job_id").await, ["job-a", "job-c"]);
    let letters: Vec<serde_json::Value> =
        column(&sql, "SELECT payload FROM outbox WHERE msg_key = 'dead-letter' ORDER BY id")
            .await
            .iter()
            .map(|p| serde_json::from_str(p).expect("JSON"))
            .collect();
    assert_eq!(letters.len(), 2, "{letters:#?}");
    assert_eq!(
        (letters[0]["offset"].as_i64(), letters[0]["reason"].as_str()),
        (Some(1), Some("`job_id` holds a NUL character"))
    );
    let reason = letters[1]["reason"].as_str().unwrap_or_default();
    assert_eq!(letters[1]["offset"], 2);
    assert!(reason.starts_with("refused by the database: ") && reason.contains("a test trigger"), "{reason}");
    // Applied again (a redelivery): nothing new.
    assert!(ing.apply_batch(&batch).await.expect("applied").is_empty());
    assert_eq!(column(&sql, "SELECT event_id FROM outbox WHERE msg_key = 'dead-letter'").await.len(), 2);
}

#[tokio::test]
async fn a_batch_applies_each_good_event_once_and_dead_letters_the_malformed_one_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    good_bad_and_duplicates(&ingest(&dir).await).await;
}

/// PostgreSQL writes the allocations needing no check with multi-row statements.
#[tokio::test]
async fn a_batch_applies_each_good_event_once_and_dead_letters_the_malformed_one_on_postgresql() {
    let name = format!("ingest_batch_{}", std::process::id());
    let url =
        tokio::task::spawn_blocking(move || gpusanity_testkit::svc::postgres_database(&name)).await.expect("database");
    good_bad_and_duplicates(&ingest_on(&url).await).await;
}

async fn good_bad_and_duplicates(f: &Fixture) {
    let (ing, sql) = (&f.ing, &f.sql);
    let batch = [
        message(0, &unchecked("e0", "job-a")),
        message(1, &unchecked("e0", "job-a")),
        message(2, "{not json"),
        message(3, &unchecked("e1", "job-b")),
        message(4, &event("e2", "job-c")),
        message(5, &event("e2", "job-c")),
    ];
    let notices = ing.apply_batch(&batch).await.expect("applied");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(column(sql, "SELECT event_id FROM job_events ORDER BY event_id").await, ["e0", "e1", "e2"]);
    assert_eq!(column(sql, "SELECT job_id FROM jobs ORDER BY job_id").await, ["job-a", "job-b", "job-c"]);
    let outputs = |sql: &AnyPool| {
        let sql = sql.clone();
        async move {
            let mut kinds: Vec<String> = column(&sql, "SELECT payload FROM outbox WHERE msg_key <> 'dead-letter'")
                .await
                .iter()
                .map(|p| {
                    let v: serde_json::Value = serde_json::from_str(p).expect("JSON");
                    format!("{} {}", v["job_id"].as_str().unwrap_or_default(), v["type"].as_str().unwrap_or_default())
                })
                .collect();
            kinds.sort();
            kinds
        }
    };
    let expected = ["job-a CheckSkipped", "job-b CheckSkipped", "job-c SanityCheckStarted"];
    assert_eq!(outputs(sql).await, expected);
    let letters = column(sql, "SELECT event_id FROM outbox WHERE msg_key = 'dead-letter'").await;
    assert_eq!(letters, ["dead-letter/job-events/0/2"]);
    // A redelivery of the batch changes nothing.
    assert!(ing.apply_batch(&batch).await.expect("applied").is_empty());
    assert_eq!(outputs(sql).await, expected);
    assert_eq!(column(sql, "SELECT event_id FROM outbox WHERE msg_key = 'dead-letter'").await.len(), 1);
    // An allocation needing no check of a job with a run in Checking cancels the run.
    let notices = ing.apply_batch(&[message(6, &unchecked("e3", "job-c"))]).await.expect("applied");
    assert!(matches!(notices.as_slice(), [gpusanity_ingest::Notice::Cancelled { .. }]), "{notices:?}");
    let mut all = expected.to_vec();
    all.extend(["job-c CheckCancelled", "job-c CheckSkipped"]);
    all.sort();
    assert_eq!(outputs(sql).await, all);
}

#[tokio::test]
async fn a_database_that_is_gone_is_an_outage_not_poison() {
    let dir = tempfile::tempdir().expect("dir");
    let ing = ingest(&dir).await.ing;
    ing.db.close().await;
    let e = ing.apply_batch(&[message(0, &event("e0", "job-a"))]).await.expect_err("no database");
    assert!(!e.is_poison(), "{e}");
    assert_eq!(
        match &e {
            gpusanity_ingest::consume::ApplyError::Db(d) => d.fault(),
            other => panic!("{other}"),
        },
        gpusanity_db::Fault::Outage
    );
}
