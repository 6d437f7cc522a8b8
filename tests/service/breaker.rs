//! The isolation backends' circuit breaker in the database (`gpusanity_db::breaker`): many
//! replicas asking at once whether they may isolate never pass the cap together, on SQLite
//! (several pools on one file) and on PostgreSQL (several pools on one database).

use gpusanity_db::breaker::{Admission, Limits};
use gpusanity_db::Db;
use gpusanity_testkit::svc;

/// Replicas (pools of their own) and the concurrent asks of each.
const REPLICAS: usize = 4;
const ASKS: usize = 8;

/// Races `REPLICAS x ASKS` admissions for distinct nodes on `url` with a cap of 3 of 10 known
/// nodes; asserts exactly 3 pass, and the table says so.
fn race(url: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(8).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut dbs = Vec::new();
        for _ in 0..REPLICAS {
            dbs.push(Db::connect(url).await.expect("db"));
        }
        let fleet: Vec<String> = (0..10).map(|i| format!("race-{i}")).collect();
        dbs[0].breaker_seen(&fleet).await.expect("seen");
        let limits = Limits { max_share: 0.3, min_nodes: 1, window_ms: 3_600_000, forget_ms: 3_600_000 };
        // Every task waits at the barrier, so the asks meet in the database.
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(REPLICAS * ASKS));
        let mut asks = tokio::task::JoinSet::new();
        for (r, db) in dbs.iter().enumerate() {
            for a in 0..ASKS {
                let (db, barrier) = (db.clone(), barrier.clone());
                let node = fleet[(r * ASKS + a) % fleet.len()].clone();
                asks.spawn(async move {
                    barrier.wait().await;
                    db.breaker_admit(&node, &format!("r{r}"), "kubernetes", limits).await.expect("admit")
                });
            }
        }
        let mut passed = 0;
        while let Some(answer) = asks.join_next().await {
            if matches!(answer.expect("task"), Admission::Admitted(_)) {
                passed += 1;
            }
        }
        assert_eq!(passed, 3, "the cap is 3 of 10 nodes");
        let rows = dbs[0].breaker_actions(1000).await.expect("actions");
        assert_eq!(rows.len(), REPLICAS * ASKS);
        assert_eq!(rows.iter().filter(|a| a.outcome == "admitted").count(), 3);
        assert_eq!(rows.iter().filter(|a| a.outcome == "refused").count(), REPLICAS * ASKS - 3);
    });
}

#[test]
fn concurrent_admissions_pass_exactly_the_cap_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    race(&format!("sqlite://{}", dir.path().join("breaker.db").display()));
}

#[test]
fn concurrent_admissions_pass_exactly_the_cap_on_postgresql() {
    let _g = svc::common::serial();
    race(&svc::postgres_database("gpusanity_breaker_race"));
}
