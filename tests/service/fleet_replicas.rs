//! Two replicas of `gpusanity serve` on one PostgreSQL ending runs at once (docs/fleet.md,
//! "Learning"): 24 one-node GEMM jobs on four CPU agents, all published together over six
//! partitions, so both replicas end runs in the same moments; the fleet's memory holds exactly
//! one figure per passed run, none lost, none twice, and the exported baseline counts them all.

use gpusanity_testkit::svc;

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use super::replicas::REPLICA;
use svc::{allocated, verdicts, World};

const JOBS: usize = 24;
const NODES: [&str; 4] = ["fr-a", "fr-b", "fr-c", "fr-d"];

#[test]
fn two_replicas_ending_runs_at_once_learn_one_figure_per_passed_run_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_fleet_replicas");
    let mut w = World::new(Some(url), "agent_timeout_s = 5.0\nagent_wait_s = 30.0\ndeadline_grace_s = 30.0");
    w.partitioned(6);
    w.serve_replica(0, REPLICA);
    w.serve_replica(1, REPLICA);
    w.wait_replicas_ready(&[0, 1], REPLICA);
    for n in NODES {
        w.agent(n);
    }
    let mut out = w.reader("check-events");
    let producer = w.job_producer();
    let started = Instant::now();
    for j in 0..JOBS {
        let job = format!("job-fr-{j}");
        producer
            .send(&job, &allocated(&format!("fr-ev-{j}"), &job, &[NODES[j % NODES.len()]], "--micro-benchmarks=gemm"));
    }
    while verdicts(&out.seen).len() < JOBS {
        assert!(started.elapsed() < Duration::from_secs(120), "not every run ended: {:#?}", verdicts(&out.seen));
        out.drain(Duration::from_millis(100));
    }
    let took = started.elapsed();
    let by_job = verdicts(&out.seen);
    assert!(by_job.values().all(|v| v.len() == 1), "one verdict a job: {by_job:?}");
    let passed: BTreeSet<String> = w.sql("SELECT run_id FROM runs WHERE state = 'CheckPassed'").into_iter().collect();
    assert_eq!(passed.len(), by_job.values().filter(|v| v[0] == "CheckPassed").count());
    assert!(passed.len() >= JOBS / 2, "most runs pass on a quiet machine: {by_job:?}");
    let owners: HashSet<String> = w.sql("SELECT owner FROM runs").into_iter().collect();
    assert_eq!(owners.len(), 2, "both replicas ended runs: {owners:?}");
    // One figure per passed run (one rank each), of that run, none of a failed one.
    let learned = w.sql("SELECT run_id FROM fleet_samples ORDER BY run_id");
    assert_eq!(learned.len(), passed.len(), "{learned:?}\n{passed:?}");
    assert_eq!(learned.into_iter().collect::<BTreeSet<_>>(), passed);
    // The baseline as exported counts them all, from every node.
    let mut c = std::process::Command::new(svc::common::bin());
    c.args(["baseline", "export", "--database", &w.db_url, "--min-samples", "1", "--min-nodes", "1"]);
    let export = svc::common::run_with_timeout(c, Duration::from_secs(60));
    assert_eq!(svc::common::code(&export), 0, "{}", svc::common::stderr(&export));
    let text = String::from_utf8_lossy(&export.stdout);
    let file = gpusanity_common::fleet::file::BaselineFile::parse(&text).expect("the exported file");
    assert_eq!(file.entries.len(), 1, "{text}");
    assert_eq!(file.entries[0].samples, passed.len(), "{text}");
    assert_eq!(file.entries[0].nodes, NODES.len(), "{text}");
    eprintln!(
        "fleet replicas: {JOBS} runs on {} replicas in {:.1} s, {} passed and learned",
        owners.len(),
        took.as_secs_f64(),
        passed.len()
    );
    w.shutdown();
}
