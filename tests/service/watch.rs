//! The watch while a job runs (docs/watch.md), through the real service, broker and agents,
//! the agents reading a recording in place of GPUs (`GPUSANITY_WATCH_REPLAY`, test rigs only):
//! once the job's check has passed, each node's agent samples the job's GPUs and publishes
//! signed summaries; the node whose GPU throttles is suspected, and only it; forged telemetry
//! moves nothing; the agents stop at JobStopped.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use gpusanity_common::wire::watch::{GpuTelemetry, Telemetry};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_service::auth::{envelope, Direction, Keyring};
use serde_json::json;
use svc::{allocated, restarted, stopped, World};

const FAST: &str =
    "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0\n\n[watch]\nrenew_s = 2\nlease_s = 6";
const NODES: [&str; 2] = ["watch-a", "watch-b"];
const GPUS: usize = 4;
/// The second of the recording at which node watch-b's GPU 2 throttles.
const ONSET: u64 = 12;

/// A recording of `GPUS` busy GPUs over 120 s; on `throttled`, GPU 2 slows by 17% with the
/// hardware thermal slowdown from [`ONSET`] on.
fn recording(node: &str, throttled: bool) -> String {
    let mut lines = Vec::new();
    for s in 0..120u64 {
        for g in 0..GPUS {
            let hot = throttled && g == 2 && s >= ONSET;
            let mhz = if hot { 1650 } else { 1980 - (s % 3) as u32 * 5 + g as u32 };
            let mut l = json!({"s": s, "gpu": format!("GPU-{node}-{g}"), "sm_mhz": mhz, "power_w": 640.0, "util": 100, "limit_w": 700.0});
            if hot {
                // HW slowdown and HW thermal slowdown, as NVML sets both.
                l["reasons"] = json!(0x48);
            }
            lines.push(l.to_string());
        }
    }
    lines.join("\n")
}

/// A summary claiming node watch-a's GPU is throttled.
fn forged(run_id: &str, job: &str) -> String {
    let gpu = GpuTelemetry {
        gpu: "GPU-watch-a-0".into(),
        sm_mhz: vec![Some(900); 5],
        power_w: vec![Some(300.0); 5],
        util_pct: vec![Some(100); 5],
        xids: vec![79],
        ..Default::default()
    };
    let t = Telemetry {
        version: WIRE_VERSION,
        node: "watch-a".into(),
        agent_id: "forger".into(),
        job_id: job.into(),
        run_id: run_id.into(),
        from: chrono::Utc::now(),
        interval_ms: 1000,
        gpus: vec![gpu],
    };
    serde_json::to_string(&t).expect("json")
}

/// The agents of both nodes, each replaying its [`recording`] (watch-b's GPU 2 throttles).
fn replaying_agents(w: &mut World) {
    for (node, throttled) in [(NODES[0], false), (NODES[1], true)] {
        let path = w.dir.path().join(format!("{node}.replay"));
        std::fs::write(&path, recording(node, throttled)).expect("recording");
        let path = path.to_string_lossy().into_owned();
        w.agent_with_env(node, &[("GPUSANITY_WATCH_REPLAY", &path)]);
    }
}

/// Whether a record of the telemetry topic is a summary of watch-b.
fn of_watch_b(v: &serde_json::Value) -> bool {
    v["payload"].as_str().is_some_and(|p| p.contains("\"node\":\"watch-b\""))
}

#[test]
fn the_throttled_node_is_suspected_and_only_it_and_the_agents_stop_with_the_job() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.serve();
    replaying_agents(&mut w);
    let mut out = w.reader("check-events");
    let mut telemetry = w.reader("telemetry");
    // Checked only at a fault-tolerant restart: the start is skipped, the restart checked.
    let args = "--micro-benchmarks=all-reduce --sanity-check-timing=AfterJobFaultTolerant";
    w.publish(allocated("watch-1", "job-watch", &NODES, args).as_bytes());
    out.wait_for(Duration::from_secs(30), "the start's CheckSkipped", |v| v["type"] == "CheckSkipped");
    w.publish(restarted("watch-2", "job-watch", 1, "FaultTolerant").as_bytes());
    let passed = out.wait_for(Duration::from_secs(90), "the verdict", |v| {
        v["job_id"] == "job-watch" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(passed["type"], "CheckPassed", "{passed:#}");
    let run_id = passed["run_id"].as_str().expect("run id").to_string();

    // Forgeries while the job runs: unsigned, signed with a key the service does not hold, and
    // signed as a report rather than telemetry.
    let other = Keyring::parse(
        "[[key]]\nid = \"other\"\nsecret = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n",
    )
    .expect("a key");
    let real = Keyring::load(&w.agent_keys()).expect("keys");
    let fake = forged(&run_id, "job-watch");
    w.publish_on("telemetry", fake.as_bytes());
    w.publish_on("telemetry", envelope::seal(other.first(), Direction::Telemetry, fake.clone()).as_bytes());
    w.publish_on("telemetry", envelope::seal(real.first(), Direction::Report, fake).as_bytes());

    // Watching starts at the next period boundary after the check passed; the onset is ONSET
    // samples in, and the suspicions follow within 10 s of it.
    let first = out.wait_for(Duration::from_secs(60), "a NodeSuspected", |v| v["type"] == "NodeSuspected");
    let mut suspected = vec![first];
    out.drain(Duration::from_secs(8));
    suspected.extend(out.of("job-watch", "NodeSuspected").into_iter().skip(1));
    let codes: Vec<(String, String, String)> = suspected
        .iter()
        .map(|v| {
            (
                v["node"].as_str().unwrap_or("").into(),
                v["gpu"].as_str().unwrap_or("").into(),
                v["code"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert!(codes.iter().all(|(n, g, _)| n == "watch-b" && g == "GPU-watch-b-2"), "only watch-b's GPU 2: {codes:?}");
    let kinds: Vec<&str> = codes.iter().map(|(_, _, c)| c.as_str()).collect();
    assert!(kinds.contains(&"WATCH_THROTTLED") && kinds.contains(&"WATCH_SLOW_CLOCK"), "{kinds:?}");
    assert_eq!(kinds.len(), 2, "each code once: {kinds:?}");
    for v in &suspected {
        assert_eq!(v["run_id"], run_id.as_str(), "{v:#}");
        assert!(v["evidence"].as_str().is_some_and(|e| !e.is_empty()), "{v:#}");
    }
    // Within 10 s of the onset: the first summary of the watch tells when sample 0 was taken.
    let start = telemetry.wait_for(Duration::from_secs(5), "a summary of watch-b", of_watch_b);
    let t0: Telemetry = serde_json::from_str(start["payload"].as_str().unwrap_or("")).expect("a summary");
    let onset = t0.from + chrono::Duration::seconds(ONSET as i64);
    let stored = w.sql("SELECT at_ms FROM node_suspicions WHERE code = 'WATCH_SLOW_CLOCK'");
    let at: i64 = stored.first().and_then(|s| s.parse().ok()).expect("stored suspicion");
    let late = at - onset.timestamp_millis();
    eprintln!("WATCH_SLOW_CLOCK stored {late} ms after the onset");
    assert!(late <= 10_000, "suspected {late} ms after the onset");
    assert!(w.log("serve").contains("telemetry refused"), "the forgeries are refused");
    assert_eq!(w.sql("SELECT count(*) FROM node_suspicions WHERE node = 'watch-a'"), ["0"]);
    // The node's reputation entry lists them.
    let (status, rep) = w.http_call("GET", "/v1/nodes/watch-b/reputation", Some(svc::TOKEN), None).expect("reputation");
    assert_eq!(status, 200, "{rep}");
    let listed: Vec<&str> =
        rep["suspicions"].as_array().map_or(vec![], |a| a.iter().filter_map(|s| s["code"].as_str()).collect());
    assert_eq!(listed.len(), 2, "{rep:#}");

    // The policy (check_at_restart, the default): a manual restart, which this job's timing
    // skips, is checked because a node was suspected; the agents stop watching the old run.
    w.publish(restarted("watch-3", "job-watch", 2, "Manual").as_bytes());
    let again = out.wait_for(Duration::from_secs(30), "the manual restart's decision", |v| {
        v["job_id"] == "job-watch" && v["cause_event_id"] == "watch-3"
    });
    assert_eq!(again["type"], "SanityCheckStarted", "{again:#}");
    let rechecked = out.wait_for(Duration::from_secs(90), "the restart's verdict", |v| {
        v["cause_event_id"] == "watch-3" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(rechecked["type"], "CheckPassed", "{rechecked:#}");

    // JobStopped: the agents stop sampling within the database refresh and a period.
    w.publish(stopped("watch-stop", "job-watch").as_bytes());
    let deadline = Instant::now() + Duration::from_secs(15);
    // Every watch an agent started, it stopped ("watching the job's GPUs" is in both lines).
    let all_stopped = |log: String| {
        let (both, stops) = (log.matches("watching the job's GPUs").count(), log.matches("stopped watching").count());
        stops >= 1 && 2 * stops >= both
    };
    while !NODES.iter().all(|n| all_stopped(w.log(n))) {
        assert!(Instant::now() < deadline, "the agents kept watching: {}", w.log(NODES[1]));
        std::thread::sleep(Duration::from_millis(200));
    }
    telemetry.drain(Duration::from_secs(6));
    let before = telemetry.seen.len();
    telemetry.drain(Duration::from_secs(7));
    assert_eq!(telemetry.seen.len(), before, "summaries after JobStopped: {:?}", &telemetry.seen[before..]);
    w.shutdown();
}

/// A PostgreSQL outage while the job runs loses no suspicion: the judgement names each (node,
/// code) once, so what the database could not store when it was raised is kept and stored when
/// the database is back, published once, with the time it was raised.
#[test]
fn a_database_outage_while_the_job_runs_loses_no_suspicion() {
    let _g = svc::common::serial();
    let pg = svc::outage::Private::postgres();
    let admin = World::new(Some(pg.value.clone()), "");
    admin.sql("CREATE DATABASE watch_outage");
    let mut w = World::new(Some(svc::with_database(&pg.value, "watch_outage")), FAST);
    w.serve();
    replaying_agents(&mut w);
    let mut out = w.reader("check-events");
    let mut telemetry = w.reader("telemetry");
    w.publish(allocated("outage-1", "job-outage", &NODES, "--micro-benchmarks=all-reduce").as_bytes());
    let passed = out.wait_for(Duration::from_secs(90), "the verdict", |v| {
        v["job_id"] == "job-outage" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(passed["type"], "CheckPassed", "{passed:#}");
    let first = telemetry.wait_for(Duration::from_secs(30), "a summary of watch-b", of_watch_b);
    let t0: Telemetry = serde_json::from_str(first["payload"].as_str().unwrap_or("")).expect("a summary");
    let onset = t0.from + chrono::Duration::seconds(ONSET as i64);

    // Down from before the onset until well after the judgement raised it and the database
    // pool gave up on storing it (its acquire timeout, 30 s).
    pg.halt();
    let summaries = |t: &svc::Reader| t.seen.iter().filter(|v| of_watch_b(v)).count();
    let before = summaries(&telemetry);
    let outage = Duration::from_secs(ONSET + 42);
    telemetry.drain(outage);
    out.drain(Duration::from_millis(500));
    assert!(out.of("job-outage", "NodeSuspected").is_empty(), "published while the database was down");
    let log = w.log("serve");
    assert!(log.contains("storing a suspicion"), "raised during the outage: {log}");
    // The renewals went on: watch-b's agent summarized every period (lease_s is 6 s here).
    let during = summaries(&telemetry) - before;
    assert!(during as u64 >= outage.as_secs() / 5 - 2, "{during} summaries of watch-b in {outage:?}");
    pg.resume();

    out.wait_for(Duration::from_secs(60), "a NodeSuspected after the outage", |v| v["type"] == "NodeSuspected");
    out.drain(Duration::from_secs(8));
    let all = out.of("job-outage", "NodeSuspected");
    let mut codes: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|v| (v["node"].as_str().unwrap_or(""), v["gpu"].as_str().unwrap_or(""), v["code"].as_str().unwrap_or("")))
        .collect();
    codes.sort();
    assert_eq!(
        codes,
        [("watch-b", "GPU-watch-b-2", "WATCH_SLOW_CLOCK"), ("watch-b", "GPU-watch-b-2", "WATCH_THROTTLED")],
        "each once, and only watch-b's GPU 2: {all:#?}"
    );
    // Stored with the time the judgement raised it: within 10 s of the onset.
    for at in w.sql("SELECT at_ms FROM node_suspicions") {
        let late = at.parse::<i64>().expect("at_ms") - onset.timestamp_millis();
        assert!((0..=10_000).contains(&late), "raised {late} ms after the onset");
    }
    w.shutdown();
}

/// The replay hook is a test hook: an agent without --test-faults ignores it, and says so.
#[test]
fn an_agent_without_test_faults_ignores_the_recording() {
    let _g = svc::common::serial();
    let w = World::new(None, FAST);
    let log = w.dir.path().join("plain-agent.log");
    let file = std::fs::File::create(&log).expect("log");
    let mut agent = std::process::Command::new(svc::common::bin())
        .args(["agent", "--node", "plain", "--device", "cpu", "--heartbeat-s", "0.3", "--config"])
        .arg(&w.config)
        .env("GPUSANITY_WATCH_REPLAY", "/nonexistent")
        .env("GPUSANITY_LOG", "info")
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("agent up") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.id() as i32), nix::sys::signal::Signal::SIGTERM);
    let _ = agent.wait();
    assert!(text.contains("GPUSANITY_WATCH_REPLAY ignored: the agent was not started with --test-faults"), "{text}");
}

/// A job of 64 nodes x 8 GPUs through the real service and broker, every node's agent
/// simulated over the real protocol with a key of its own (bench/sim_agents.rs), publishing
/// synthetic telemetry once watched; GPU 0 of node 41 runs 10% slower from 30 s on. Exactly
/// that node is suspected (WATCH_SLOW_CLOCK), within 10 s of the onset, and no other.
#[test]
fn in_a_64_node_job_exactly_the_slow_node_is_suspected_in_time() {
    use crate::scale_job::sim_agents::{self, SimTelemetry};
    use crate::scale_job::SimFleet;
    const N: usize = 64;
    const SLOW: usize = 41;
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    // A key per node, as a fleet provisions them (the same helper as the 256-node job's).
    crate::scale_job::node_keys_for(&w.agent_keys(), N);
    w.serve();
    let mut out = w.reader("check-events");
    let report = sim_agents::report(N, 8).expect("node 0's report");
    let slow = SimTelemetry { topic: w.topic("telemetry"), gpus: 8, slow_node: SLOW, onset_s: 30, factor: 0.9 };
    let SimFleet { tally, stop, agents } = crate::scale_job::start_fleet(&w, N, report, Some(slow));
    let mut telemetry = w.reader("telemetry");
    let names: Vec<String> = (0..N).map(sim_agents::node_name).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // Every agent heard before the job comes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while tally.lock().expect("tally").heartbeats < (N as u64) * 2 {
        assert!(Instant::now() < deadline, "the simulated agents never beat");
        std::thread::sleep(Duration::from_millis(100));
    }
    w.publish(allocated("scale-watch", "job-watch64", &names, "--sanity-check-max-time=5").as_bytes());
    let end = out.wait_for(Duration::from_secs(120), "the verdict", |v| {
        v["job_id"] == "job-watch64" && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    });
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let first = telemetry.wait_for(Duration::from_secs(30), "the first summary", |v| v["payload"].is_string());
    let t0: Telemetry = serde_json::from_str(first["payload"].as_str().unwrap_or("")).expect("a summary");
    let s = out.wait_for(Duration::from_secs(90), "a NodeSuspected", |v| v["type"] == "NodeSuspected");
    // Anything else would come within a few periods more.
    out.drain(Duration::from_secs(15));
    let _ = stop.send(true);
    agents.join().expect("the agents' thread").expect("the simulated agents");
    let all = out.of("job-watch64", "NodeSuspected");
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!((s["node"].as_str(), s["code"].as_str()), (Some(names[SLOW]), Some("WATCH_SLOW_CLOCK")), "{s:#}");
    assert_eq!(s["gpu"], format!("GPU-{}-0", names[SLOW]), "{s:#}");
    let onset = t0.from.timestamp_millis() + 30_000;
    let at: i64 = w.sql("SELECT at_ms FROM node_suspicions").first().and_then(|v| v.parse().ok()).expect("stored");
    eprintln!("64 x 8: WATCH_SLOW_CLOCK stored {} ms after the onset", at - onset);
    assert!(at - onset <= 10_000, "suspected {} ms after the onset", at - onset);
    let g = tally.lock().expect("tally").clone();
    assert!(g.watches >= N && g.refused == 0, "{g:?}");
    w.shutdown();
}
