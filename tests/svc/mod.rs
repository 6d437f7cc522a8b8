//! Helpers for the service tests: one real Kafka broker per test binary (or the one named by
//! GPUSANITY_TEST_KAFKA), real `gpusanity serve` and `gpusanity agent` processes, topics of
//! their own per test, a reader of the output topics, raw HTTP and SQL on the service's
//! database.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

#[path = "../common/mod.rs"]
pub mod common;

pub const TOKEN: &str = "test-token-0123456789";

/// The broker's bootstrap address: GPUSANITY_TEST_KAFKA when set (it must answer), else a
/// broker started by scripts/kafka.sh for this test binary and stopped when it exits.
pub fn broker() -> &'static str {
    static BROKER: OnceLock<String> = OnceLock::new();
    BROKER.get_or_init(|| {
        if let Ok(b) = std::env::var("GPUSANITY_TEST_KAFKA") {
            let addr = b.split(',').next().unwrap_or_default().to_string();
            std::net::TcpStream::connect_timeout(&addr.parse().expect("GPUSANITY_TEST_KAFKA: host:port"), Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("GPUSANITY_TEST_KAFKA={b} is set but the broker does not answer: {e}"));
            return b;
        }
        start_script("kafka.sh", "KAFKA_STATE", "KAFKA_BOOTSTRAP=")
    })
}

/// Runs `scripts/SCRIPT start` with its state file in a temp dir and returns the value of its
/// `KEY...` line; a watchdog runs `SCRIPT stop` once this test binary has exited.
fn start_script(script: &str, state_var: &str, key: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    // Readable by the `postgres` user the database server runs as under root.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let state = dir.join("state");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(script);
    let out = Command::new("bash").arg(&script).arg("start").env(state_var, &state).env("TMPDIR", &dir).output().expect("running a script");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{} start failed: {text}{}", script.display(), String::from_utf8_lossy(&out.stderr));
    let value = text.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} line in: {text}")).to_string();
    let watch = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.5; done; {state_var}='{}' TMPDIR='{}' bash '{}' stop; rm -rf '{}'",
        std::process::id(),
        state.display(),
        dir.display(),
        script.display(),
        dir.display()
    );
    // Started in the background of a shell that exits at once, so it is nobody's zombie.
    let status = Command::new("sh").arg("-c").arg(format!("({watch}) >/dev/null 2>&1 </dev/null &")).status().expect("watchdog");
    assert!(status.success(), "starting the watchdog failed");
    value
}

/// A PostgreSQL server's admin URL: GPUSANITY_TEST_POSTGRES when set (it must answer), else a
/// throwaway cluster started by scripts/postgres.sh for this test binary and stopped when it exits.
fn postgres_admin() -> &'static str {
    static PG: OnceLock<String> = OnceLock::new();
    PG.get_or_init(|| {
        if let Ok(u) = std::env::var("GPUSANITY_TEST_POSTGRES") {
            return u;
        }
        start_script("postgres.sh", "PG_STATE", "DATABASE_URL=")
    })
}

/// A fresh, empty PostgreSQL database for one test; its URL.
pub fn postgres_database(name: &str) -> String {
    let admin = postgres_admin();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(admin).await.unwrap_or_else(|e| panic!("PostgreSQL at {admin} does not answer: {e}"));
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&pool).await.expect("drop database");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.expect("create database");
    });
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
    format!("{base}/{name}")
}

/// One test's world: its own topics, database, HTTP port and processes.
pub struct World {
    pub dir: tempfile::TempDir,
    pub tag: String,
    pub prefix: String,
    pub db_url: String,
    pub http: u16,
    pub config: PathBuf,
    /// The nodes that have an agent.
    pub nodes: Vec<String>,
    children: Vec<(String, Child)>,
}

impl World {
    /// `db_url`: None for a SQLite file in the test's folder. `coordinator`: extra TOML lines
    /// for the [coordinator] table.
    pub fn new(db_url: Option<String>, coordinator: &str) -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let tag = format!("svc{}", dir.path().file_name().unwrap().to_string_lossy().replace('.', ""));
        let prefix = format!("t.{tag}.");
        let db_url = db_url.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("gpusanity.db").display()));
        let http = common::free_port();
        let config = dir.path().join("gpusanity.toml");
        let p = &prefix;
        let text = format!(
            "[kafka]\nbootstrap = \"{b}\"\ngroup = \"{p}service\"\n\n[topics]\njob_events = \"{p}job-events\"\noutput = \"{p}check-events\"\n\
             dead_letter = \"{p}dead-letter\"\nagent_tasks = \"{p}agent-tasks\"\nagent_reports = \"{p}agent-reports\"\n\n\
             [database]\nurl = \"{db_url}\"\n\n[http]\nlisten = \"127.0.0.1:{http}\"\n\n[coordinator]\nreport_url = \"http://127.0.0.1:{http}/v1/runs/{{run_id}}/report\"\n{coordinator}\n",
            b = broker()
        );
        std::fs::write(&config, text).expect("config");
        World { dir, tag, prefix, db_url, http, config, nodes: Vec::new(), children: Vec::new() }
    }

    /// A world on SQLite with the service running, an agent per node in `nodes`, and a reader
    /// of the output topic.
    pub fn running(coordinator: &str, nodes: &[&str]) -> (World, Reader) {
        let mut w = World::new(None, coordinator);
        w.serve();
        for n in nodes {
            w.agent(n);
        }
        let out = w.reader("check-events");
        (w, out)
    }

    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn spawn(&mut self, name: &str, args: &[&str]) {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).expect("log");
        let mut c = Command::new(common::bin());
        c.args(args)
            .arg("--config")
            .arg(&self.config)
            .env("GPUSANITY_TEST_TAG", &self.tag)
            .env("GPUSANITY_API_TOKEN", TOKEN)
            .env("GPUSANITY_LOG", "info")
            .env_remove("GPUSANITY_KAFKA_BOOTSTRAP")
            .env_remove("GPUSANITY_DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.children.push((name.to_string(), c.spawn().expect("spawn gpusanity")));
    }

    pub fn serve(&mut self) {
        self.spawn("serve", &["serve"]);
        self.wait_health(Duration::from_secs(60));
    }

    /// An agent for `node`: CPU, one worker.
    pub fn agent(&mut self, node: &str) {
        self.nodes.push(node.to_string());
        let work = self.dir.path().join(format!("agent-{node}"));
        let work = work.to_string_lossy().into_owned();
        self.spawn(node, &["agent", "--node", node, "--device", "cpu", "--nproc-per-node", "1", "--heartbeat-s", "0.3", "--work-dir", &work]);
    }

    pub fn pid(&self, name: &str) -> i32 {
        self.children.iter().find(|(n, _)| n == name).map(|(_, c)| c.id() as i32).expect("no such process")
    }

    /// SIGKILLs the process `name` and reaps it.
    pub fn kill(&mut self, name: &str) {
        let i = self.children.iter().position(|(n, _)| n == name).expect("no such process");
        let (_, mut c) = self.children.remove(i);
        let _ = c.kill();
        let _ = c.wait();
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn wait_health(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = self.http_call("GET", "/health", None, None) {
                return;
            }
            assert!(start.elapsed() < limit, "the service never became healthy; its log:\n{}", self.log("serve"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One HTTP/1.1 request to the service; (status, JSON body).
    pub fn http_call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> std::io::Result<(u16, Value)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let json = resp.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
        Ok((status, json))
    }

    /// Publishes a JobResourcesAllocated for a job on every node that has an agent.
    pub fn allocate(&self, event_id: &str, job: &str, args: &str) {
        let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        self.publish(allocated(event_id, job, &nodes, args).as_bytes());
    }

    /// Publishes raw bytes on the job-events topic.
    pub fn publish(&self, payload: &[u8]) {
        let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new().set("bootstrap.servers", broker()).create().expect("producer");
        let topic = self.topic("job-events");
        p.send(BaseRecord::<(), [u8]>::to(&topic).payload(payload)).map_err(|(e, _)| e).expect("send");
        p.flush(Duration::from_secs(10)).expect("flush");
    }

    pub fn reader(&self, topic: &str) -> Reader {
        Reader::new(&self.topic(topic))
    }

    /// Runs SQL on the service's database and returns the first column of every row as text.
    pub fn sql(&self, query: &str) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            use sqlx::Row;
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&self.db_url).await.expect("connect to the service's database");
            let rows = sqlx::query(query).fetch_all(&pool).await.expect("query");
            rows.iter()
                .map(|r| r.try_get::<String, _>(0).or_else(|_| r.try_get::<i64, _>(0).map(|v| v.to_string())).unwrap_or_default())
                .collect()
        })
    }

    /// SIGTERMs everything this world started and checks that nothing carrying its tag is left.
    pub fn shutdown(&mut self) {
        for (_, c) in &self.children {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (name, c) in &mut self.children {
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("{name} did not stop on SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.children.clear();
        let run = common::Run { dir: tempfile::tempdir().expect("tempdir"), tag: self.tag.clone() };
        run.assert_nothing_left();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads a topic from its beginning, keeping everything seen.
pub struct Reader {
    consumer: BaseConsumer,
    pub seen: Vec<Value>,
}

impl Reader {
    pub fn new(topic: &str) -> Reader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker())
            .set("group.id", format!("reader-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "true")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning).expect("partition");
        consumer.assign(&tpl).expect("assign");
        Reader { consumer, seen: Vec::new() }
    }

    /// Reads whatever arrives within `d`.
    pub fn drain(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(50)) {
                if let Some(p) = m.payload() {
                    self.seen.push(serde_json::from_slice(p).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(p).into_owned())));
                }
            }
        }
    }

    /// Waits for the first message (seen before or arriving) that matches `pred`.
    pub fn wait_for(&mut self, limit: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.seen.iter().find(|v| pred(v)) {
                return v.clone();
            }
            assert!(start.elapsed() < limit, "no {what} within {limit:?}; seen: {:#?}", self.seen);
            self.drain(Duration::from_millis(100));
        }
    }

    /// Messages of `type` about `job`.
    pub fn of(&self, job: &str, kind: &str) -> Vec<Value> {
        self.seen.iter().filter(|v| v["job_id"] == job && v["type"] == kind).cloned().collect()
    }
}

/// A JobResourcesAllocated event for nodes named `nodes` (one GPU each).
pub fn allocated(event_id: &str, job: &str, nodes: &[&str], args: &str) -> String {
    let nodes: Vec<Value> = nodes.iter().map(|n| serde_json::json!({ "name": n, "address": "127.0.0.1", "gpus": 1 })).collect();
    serde_json::json!({
        "version": 1, "type": "JobResourcesAllocated", "event_id": event_id, "job_id": job, "workspace_id": "ws-1",
        "attempt": 0, "framework": "PyTorch", "nodes": nodes,
        "settings": { "EnableSanityCheck": true, "SanityCheckArgs": args }
    })
    .to_string()
}

pub fn restarted(event_id: &str, job: &str, attempt: u32, reason: &str) -> String {
    serde_json::json!({ "version": 1, "type": "JobRestarted", "event_id": event_id, "job_id": job, "workspace_id": "ws-1", "attempt": attempt, "reason": reason })
        .to_string()
}

pub fn stopped(event_id: &str, job: &str) -> String {
    serde_json::json!({ "version": 1, "type": "JobStopped", "event_id": event_id, "job_id": job, "workspace_id": "ws-1" }).to_string()
}

/// JobResourcesAllocated for a 2-node job, an agent per node: CheckPassed on the output topic
/// and the rows in the database; a redelivered event is applied once.
pub fn two_node_pass(w: &mut World) {
    w.serve();
    w.agent("node-a");
    w.agent("node-b");
    let mut out = w.reader("check-events");
    w.allocate("ev-1", "job-1", "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1");

    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    assert_eq!(started["job_id"], "job-1");
    assert_eq!(started["nodes"], serde_json::json!(["node-a", "node-b"]));
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    let passed = out.wait_for(Duration::from_secs(90), "CheckPassed", |v| v["type"] == "CheckPassed" || v["type"] == "CheckFailed");
    assert_eq!(passed["type"], "CheckPassed", "{passed:#}\nserve log:\n{}", w.log("serve"));
    assert_eq!(passed["run_id"], run_id.as_str());
    assert_eq!(passed["cause_event_id"], "ev-1");

    // Rows: the run, its transitions, every rank's results of both checks, node health.
    let q = |sql: &str| w.sql(&sql.replace("RUN", &run_id));
    assert_eq!(q("SELECT state FROM runs WHERE run_id = 'RUN'"), ["CheckPassed"]);
    assert_eq!(q("SELECT state FROM transitions WHERE run_id = 'RUN' ORDER BY id"), ["Checking", "CheckPassed"]);
    let mut checks = q("SELECT check_name || ':' || CAST(rank AS TEXT) || ':' || status FROM rank_results WHERE run_id = 'RUN'");
    checks.sort();
    assert_eq!(checks, ["all-reduce:0:passed", "all-reduce:1:passed", "gemm:0:passed", "gemm:1:passed"]);
    let mut health = q("SELECT node_name || ':' || CAST(healthy AS TEXT) FROM node_health WHERE run_id = 'RUN'");
    health.sort();
    assert_eq!(health, ["node-a:1", "node-b:1"]);
    assert_eq!(q("SELECT event_type FROM job_events WHERE event_id = 'ev-1'"), ["JobResourcesAllocated"]);
    // The report is stored and served behind the token.
    let (code, report) = w.http_call("GET", &format!("/v1/runs/{run_id}/report"), Some(TOKEN), None).unwrap();
    assert_eq!(code, 200);
    assert_eq!(report["status"], "passed");
    assert_eq!(report["nodes"].as_array().map(Vec::len), Some(2));
    assert_eq!(w.http_call("GET", &format!("/v1/runs/{run_id}"), None, None).unwrap().0, 401);

    // A redelivered event (same id) is applied once; JobStopped with no run cancels nothing.
    w.allocate("ev-1", "job-1", "");
    w.publish(stopped("ev-2", "job-1").as_bytes());
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.sql("SELECT event_id FROM job_events WHERE event_id = 'ev-2'").is_empty() {
        assert!(Instant::now() < deadline, "JobStopped never stored");
        std::thread::sleep(Duration::from_millis(100));
    }
    out.drain(Duration::from_secs(1));
    assert_eq!(out.of("job-1", "SanityCheckStarted").len(), 1, "a duplicate event started a second run: {:#?}", out.seen);
    assert_eq!(w.sql("SELECT COUNT(*) FROM runs").first().map(String::as_str), Some("1"));
}
