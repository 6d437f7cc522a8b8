//! The fleet's samples in the service's database (SQLite; PostgreSQL when
//! GPUSANITY_TEST_POSTGRES names a server): a real CPU report's figures learned run after run
//! through the coordinator's own rule, a fault-injected run and a run ended twice adding
//! nothing, then `gpusanity baseline export` through the real binary and `gpusanity check
//! --baseline` with the file it wrote.

use std::time::Duration;

use gpusanity_common::fleet::samples::learnable;
use gpusanity_common::report::Report;
use gpusanity_db::{fleet, Db};
use gpusanity_testkit::common::*;
use gpusanity_testkit::skip::{missing, Prereq};

const LIMIT: Duration = Duration::from_secs(90);
const ARGS: [&str; 2] = ["--nproc-per-node=2", "--micro-benchmarks=gemm"];

async fn learn_runs(db: &Db, report: &Report, runs: usize, first: usize) -> usize {
    let mut added = 0;
    for i in first..first + runs {
        let names = vec![format!("node-{}", i % 5)];
        let samples = learnable(report, &names);
        added += samples.len();
        let mut tx = db.begin().await.expect("tx");
        fleet::add_samples(&mut tx, &format!("run-{i}"), &samples).await.expect("samples");
        tx.commit().await.expect("commit");
    }
    added
}

fn fleet_round_trip(url: &str) {
    // A real report of this CPU, as node 0's agent would hand it to the service.
    let run = Run::new();
    let out = run_with_timeout(run.command(&ARGS), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report: Report = serde_json::from_value(run.report()).expect("report.json");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let db = Db::connect(url).await.expect("database");
        assert_eq!(learn_runs(&db, &report, 20, 0).await, 40, "two ranks a run");
        assert_eq!(db.fleet_sample_count().await.expect("count"), 40);
        // Ended twice (a replica that lost its lease): the unique (run, rank, key) keeps one.
        learn_runs(&db, &report, 3, 0).await;
        assert_eq!(db.fleet_sample_count().await.expect("count"), 40);
        // A fault-injected run and a failed run are never learned.
        let mut faulted = report.clone();
        faulted.settings.envs.push(("GPUSANITY_FAULT".into(), "gemm-slow@0".into()));
        assert_eq!(learn_runs(&db, &faulted, 5, 100).await, 0);
        let mut failed = report.clone();
        failed.status = gpusanity_common::report::RunStatus::Failed;
        assert_eq!(learn_runs(&db, &failed, 5, 200).await, 0);
        assert_eq!(db.fleet_sample_count().await.expect("count"), 40);
        assert_eq!(db.fleet_keys().await.expect("keys").len(), 1);
    });
    // Exported by the real binary: one entry, from 40 samples of 5 nodes.
    let file = run.dir.path().join("baseline.toml");
    let out = run_with_timeout(
        {
            let mut c = std::process::Command::new(bin());
            c.args(["baseline", "export", "--database", url, "--out"]).arg(&file);
            c
        },
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let parsed = gpusanity_common::fleet::file::BaselineFile::read(&file).expect("the exported file reads");
    assert_eq!(parsed.entries.len(), 1);
    let e = &parsed.entries[0];
    assert_eq!((e.samples, e.nodes, e.window), (40, 5, 200), "{e:?}");
    // Six distinct nodes required: no entry.
    let out = run_with_timeout(
        {
            let mut c = std::process::Command::new(bin());
            c.args(["baseline", "export", "--database", url, "--min-nodes", "6"]);
            c
        },
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("[[entry]]"), "too few nodes: no entry");
    // And `check --baseline` judges every rank with it (the same CPU: not below, a percentile).
    let check = Run::new();
    let out = run_with_timeout(check.command(&[ARGS[0], ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
    let r = check.report();
    let gemm = r["checks"].as_array().unwrap().iter().find(|c| c["name"] == "gemm").unwrap().clone();
    for rank in gemm["ranks"].as_array().unwrap() {
        assert_eq!(rank["fleet"]["samples"], 40, "{rank}");
        assert!(rank["fleet"]["percentile"].as_f64().is_some());
    }
    // A shared CPU may fall below its own fleet; if it did, the finding says so.
    if code(&out) != 0 {
        assert!(findings(&r).iter().all(|(c, _)| c == "BELOW_FLEET"), "{}", r["findings"]);
    }
}

#[test]
fn the_fleet_learns_passed_runs_only_and_exports_a_baseline_on_sqlite() {
    let _g = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    fleet_round_trip(&format!("sqlite://{}", dir.path().join("fleet.db").display()));
}

#[test]
fn the_fleet_learns_passed_runs_only_and_exports_a_baseline_on_postgres() {
    let _g = serial();
    if std::env::var("GPUSANITY_TEST_POSTGRES").is_err() {
        missing(Prereq::Postgres, "GPUSANITY_TEST_POSTGRES is not set");
        return;
    }
    fleet_round_trip(&gpusanity_testkit::svc::postgres_database("gpusanity_fleet"));
}
