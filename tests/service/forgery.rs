//! The agent protocol as a trust boundary: messages forged by anyone who can write to a topic
//! (unsigned, signed with another key, or signed but about a node or run they do not hold) are
//! refused and logged, and the runs' verdicts stay what the real agents measured; a job's
//! settings cannot make the agent load code or write outside its work dir.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use gpusanity_common::wire::agent::{AgentCommand, AgentReport, CommandBody, NodeResult, ReportBody, Task};
use gpusanity_service::auth::{envelope, Direction, Keyring};
use svc::{allocated, World};

const QUICK: &str = "agent_timeout_s = 2.0\nagent_wait_s = 4.0\ndeadline_grace_s = 10.0";

fn ring(w: &World) -> Keyring {
    Keyring::load(&w.agent_keys()).expect("the world's agent keys")
}

/// A key ring nobody gave the service.
fn stranger() -> Keyring {
    Keyring::parse(&format!("[[key]]\nid = \"test\"\nsecret = \"{}\"\n", "5a".repeat(32))).expect("ring")
}

fn result(node: &str, agent_id: &str, run_id: &str, node_rank: usize) -> String {
    let r = AgentReport {
        version: 1,
        node: node.into(),
        agent_id: agent_id.into(),
        at: chrono::Utc::now(),
        body: ReportBody::Result(NodeResult {
            run_id: run_id.into(),
            node_rank,
            exit_code: Some(0),
            report: None,
            report_chunks: None,
            error: None,
        }),
    };
    serde_json::to_string(&r).expect("json")
}

fn heartbeat(node: &str, agent_id: &str) -> String {
    let r = AgentReport {
        version: 1,
        node: node.into(),
        agent_id: agent_id.into(),
        at: chrono::Utc::now(),
        body: ReportBody::Heartbeat { address: "127.0.0.1".into(), run_id: None, elapsed_s: None },
    };
    serde_json::to_string(&r).expect("json")
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn forged_results_do_not_end_a_run_and_the_missing_node_is_still_named() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(QUICK, &["f-a"]);
    w.publish(allocated("forge-1", "job-forge", &["f-a", "f-ghost"], "--sanity-check-max-time=1").as_bytes());
    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    let (real, other) = (ring(&w), stranger());
    for k in 0..2 {
        // Unsigned, as before the envelope; signed with a key the service does not have;
        // signed with the real key but about nodes and agents that do not hold the run.
        w.publish_on("agent-reports", result("f-ghost", "forger", &run_id, k).as_bytes());
        let wrong_key = envelope::seal(other.first(), Direction::Report, result("f-ghost", "forger", &run_id, k));
        w.publish_on("agent-reports", wrong_key.as_bytes());
        let elsewhere = envelope::seal(real.first(), Direction::Report, result("someone-else", "forger", &run_id, k));
        w.publish_on("agent-reports", elsewhere.as_bytes());
        let as_task = envelope::seal(real.first(), Direction::Task, result("f-ghost", "forger", &run_id, k));
        w.publish_on("agent-reports", as_task.as_bytes());
    }
    let end = out.wait_for(Duration::from_secs(40), "the verdict", |v| {
        v["run_id"] == run_id.as_str() && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    });
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["f-ghost"]), "{end:#}");
    assert!(end["summary"].as_str().unwrap_or("").contains("no live agent on node(s) f-ghost"), "{end:#}");
    let log = w.log("serve");
    assert!(count(&log, "agent report refused") >= 8, "{log}");
    assert!(log.contains("bad signature"), "{log}");
    w.shutdown();
}

#[test]
fn forged_heartbeats_of_a_new_agent_do_not_isolate_a_healthy_node() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(QUICK, &["h-a"]);
    let other = stranger();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let forger = {
        let (stop, topic) = (stop.clone(), w.topic("agent-reports"));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                svc::publish_to(&topic, heartbeat("h-a", "replacement").as_bytes());
                let signed = envelope::seal(other.first(), Direction::Report, heartbeat("h-a", "replacement"));
                svc::publish_to(&topic, signed.as_bytes());
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // The forgeries reach the service, and are refused, before the run starts.
    w.wait_log("serve", Duration::from_secs(30), "both forged heartbeats refused", |log| {
        log.contains("agent report refused: not a signed message")
            && log.contains("agent report refused: bad signature")
    });
    w.allocate("hb-1", "job-hb", "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1");
    let end = out.wait_for(Duration::from_secs(60), "the verdict", |v| {
        v["job_id"] == "job-hb" && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = forger.join();
    assert_eq!(end["type"], "CheckPassed", "{end:#}\n{}", w.log("serve"));
    // A NodeIsolated would have been queued with the verdict, before this later event's answer.
    w.output_caught_up(&mut out, "hb-after");
    assert!(out.of("job-hb", "NodeIsolated").is_empty(), "{:#?}", out.seen);
    w.shutdown();
}

fn task(node: &str, run_id: &str, args: &str) -> String {
    let c = AgentCommand {
        version: 1,
        node: node.into(),
        body: CommandBody::Task(Task {
            run_id: run_id.into(),
            job_id: String::new(),
            nnodes: 1,
            node_rank: 0,
            master: None,
            sanity_check_args: args.into(),
            deadline: chrono::Utc::now() + chrono::Duration::seconds(30),
            rdzv_secret: None,
            gpus: None,
            gpu_ids: Vec::new(),
            baseline: None,
        }),
    };
    serde_json::to_string(&c).expect("json")
}

#[test]
fn forged_tasks_start_nothing_and_write_nothing_outside_the_work_dir() {
    let _g = svc::common::serial();
    let mut w = World::new(None, QUICK);
    w.agent("t-a");
    let real = ring(&w);
    let work = w.dir.path().join("agent-t-a");
    let deadline = Instant::now() + Duration::from_secs(20);
    // The agent's reader of tasks starts where the topic ended before the agent says it is up:
    // every task published from then on reaches it.
    while !w.log("t-a").contains("agent up") {
        assert!(Instant::now() < deadline, "the agent never came up: {}", w.log("t-a"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let outside = w.dir.path().join("escape");
    let absolute = w.dir.path().join("absolute");
    let uuid = uuid::Uuid::new_v4().to_string();
    // Unsigned (anyone), then signed but escaping, then signed with a job setting that loads code.
    w.publish_on("agent-tasks", task("t-a", &uuid, "").as_bytes());
    for id in ["../escape".to_string(), absolute.display().to_string()] {
        w.publish_on("agent-tasks", envelope::seal(real.first(), Direction::Task, task("t-a", &id, "")).as_bytes());
    }
    let evil = uuid::Uuid::new_v4().to_string();
    let preload = "--sanity-check-envs=LD_PRELOAD=/nonexistent/evil.so";
    w.publish_on("agent-tasks", envelope::seal(real.first(), Direction::Task, task("t-a", &evil, preload)).as_bytes());
    // A replay of that task is refused as such.
    let sealed = envelope::seal(real.first(), Direction::Task, task("t-a", &uuid::Uuid::new_v4().to_string(), "x"));
    w.publish_on("agent-tasks", sealed.as_bytes());
    w.publish_on("agent-tasks", sealed.as_bytes());
    let launcher_log = work.join(&evil).join("launcher.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&launcher_log).unwrap_or_default();
        if log.contains("may not set LD_PRELOAD") {
            break;
        }
        assert!(Instant::now() < deadline, "launcher log: {log}\nagent log: {}", w.log("t-a"));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The replay is the last task published: once it is refused, the agent (which takes its
    // tasks in order) has handled every one before it.
    let log = w.wait_log("t-a", Duration::from_secs(30), "the replay refused", |log| log.contains("replayed message"));
    assert_eq!(count(&log, "task refused: its run id is not a UUID"), 2, "{log}");
    assert!(log.contains("agent command refused: not a signed message"), "{log}");
    assert!(!outside.exists() && !absolute.exists(), "a folder was made outside the work dir");
    assert!(!work.join(&uuid).exists(), "the unsigned task ran");
    w.shutdown();
}

#[test]
fn job_settings_that_load_code_or_inject_faults_are_dead_letters() {
    let _g = svc::common::serial();
    let mut w = World::new(None, QUICK);
    let cfg = std::fs::read_to_string(&w.config).expect("config");
    std::fs::write(&w.config, cfg.replace("test_faults = true", "test_faults = false")).expect("config");
    w.serve();
    let mut dead = w.reader("dead-letter");
    for (id, envs) in [
        ("env-1", "LD_PRELOAD=./evil.so"),
        ("env-2", "GPUSANITY_WORKER_SPEC={}"),
        ("env-3", "GPUSANITY_FAULT=gemm-wrong@0"),
        ("env-4", "NCCL_NET_PLUGIN=/tmp/evil.so"),
    ] {
        w.publish(allocated(id, &format!("job-{id}"), &["n1"], &format!("--sanity-check-envs={envs}")).as_bytes());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while dead.seen.len() < 4 {
        assert!(Instant::now() < deadline, "dead letters: {:#?}", dead.seen);
        dead.drain(Duration::from_millis(200));
    }
    let reasons: Vec<String> = dead.seen.iter().map(|d| d["reason"].as_str().unwrap_or("").to_string()).collect();
    assert!(reasons[0].contains("may not set LD_PRELOAD"), "{reasons:?}");
    assert!(reasons[1].contains("may not set GPUSANITY_WORKER_SPEC"), "{reasons:?}");
    assert!(reasons[2].contains("fault injection is off"), "{reasons:?}");
    assert!(reasons[3].contains("may not set NCCL_NET_PLUGIN"), "{reasons:?}");
    w.shutdown();
}

#[test]
fn serve_without_a_private_key_file_is_a_usage_error() {
    let w = World::new(None, QUICK);
    let run = |edit: &dyn Fn(&str) -> String| {
        let cfg = w.dir.path().join("other.toml");
        std::fs::write(&cfg, edit(&std::fs::read_to_string(&w.config).expect("config"))).expect("config");
        let mut c = std::process::Command::new(svc::common::bin());
        c.args(["serve", "--config"])
            .arg(&cfg)
            .env("GPUSANITY_API_TOKEN", svc::TOKEN)
            .env_remove("GPUSANITY_AGENT_KEYS");
        svc::common::run_with_timeout(c, Duration::from_secs(20))
    };
    let keys = w.agent_keys().display().to_string();
    let out = run(&|c| c.replace(&format!("keys_file = \"{keys}\""), ""));
    assert_eq!(svc::common::code(&out), 2, "{}", svc::common::stderr(&out));
    assert!(svc::common::stderr(&out).contains("no agent key file"), "{}", svc::common::stderr(&out));
    let open = w.dir.path().join("open-keys.toml");
    std::fs::copy(w.agent_keys(), &open).expect("copy");
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    let out = run(&|c| c.replace(&keys, &open.display().to_string()));
    assert_eq!(svc::common::code(&out), 2, "{}", svc::common::stderr(&out));
    assert!(svc::common::stderr(&out).contains("chmod 600"), "{}", svc::common::stderr(&out));
}
