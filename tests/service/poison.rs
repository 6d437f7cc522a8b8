//! Poison messages through real processes on PostgreSQL: a job event or an agent report that
//! validation refuses (a NUL), and one that the database itself refuses (a test trigger raising
//! a data exception), each becomes a dead letter with the reason while `gpusanity serve` keeps
//! running and handles the next good message; a forged stored report gets an error page, and
//! serve keeps answering.

use gpusanity_testkit::svc;

use std::io::{Read, Write};
use std::time::Duration;

use gpusanity_service::auth::{envelope, Direction, Keyring};
use serde_json::{json, Value};
use svc::{allocated, Reader, World};

const WAIT: Duration = Duration::from_secs(30);

/// A world on a fresh PostgreSQL database with serve running (no agents).
fn pg_world(name: &str, coordinator: &str) -> World {
    let url = svc::postgres_database(name);
    let mut w = World::new(Some(url), coordinator);
    w.serve();
    w
}

/// A trigger on `table` that raises SQLSTATE `code` for rows whose `column` contains `marker`.
fn refuse_rows(w: &World, table: &str, column: &str, marker: &str, code: &str) {
    w.sql(&format!(
        "CREATE FUNCTION refuse_{table}() RETURNS trigger AS $$ BEGIN IF NEW.{column} LIKE '%{marker}%' THEN \
         RAISE EXCEPTION 'a test trigger refused the row' USING ERRCODE = '{code}'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
    ));
    w.sql(&format!(
        "CREATE TRIGGER refuse_{table} BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION refuse_{table}()"
    ));
}

fn assert_serving(w: &World) {
    w.wait_health(Duration::from_secs(5));
    assert!(!w.log("serve").contains("panicked"), "{}", w.log("serve"));
}

fn started_run(out: &mut Reader, job: &str) -> String {
    let v = out.wait_for(WAIT, "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted" && v["job_id"] == job);
    v["run_id"].as_str().expect("run_id").to_string()
}

#[test]
fn poison_job_events_become_dead_letters_on_postgresql() {
    let _g = svc::common::serial();
    let mut w = pg_world("gpusanity_poison_jobs", "agent_wait_s = 30.0");
    let mut out = w.reader("check-events");
    let mut dead = w.reader("dead-letter");
    refuse_rows(&w, "jobs", "job_id", "refuse-me", "22023");

    w.publish(allocated("p-nul", "job\u{0}1", &["pg-n1"], "").as_bytes());
    let dl = dead.wait_for(WAIT, "the NUL's dead letter", |v| v["offset"] == 0);
    assert_eq!(dl["reason"], "`job_id` holds a NUL character", "{dl:#}");
    assert_eq!(dl["topic"], w.topic("job-events"));
    assert!(dl["payload"].as_str().is_some_and(|p| p.contains("p-nul")), "{dl:#}");

    // Refused by the database itself, in the same batch as a good event, which still applies.
    w.publish(allocated("p-db", "job-refuse-me", &["pg-n1"], "").as_bytes());
    w.publish(allocated("p-good", "job-good", &["pg-n1"], "").as_bytes());
    let dl = dead.wait_for(WAIT, "the database's dead letter", |v| v["offset"] == 1);
    let reason = dl["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("refused by the database: ") && reason.contains("a test trigger"), "{dl:#}");
    started_run(&mut out, "job-good");
    assert_eq!(w.sql("SELECT job_id FROM jobs"), ["job-good"]);
    assert_eq!(w.sql("SELECT event_id FROM job_events"), ["p-good"]);
    assert_serving(&w);

    // A restart does not read them again (their offsets were committed): no crash loop.
    w.kill("serve");
    w.serve();
    w.publish(allocated("p-after", "job-after", &["pg-n1"], "").as_bytes());
    started_run(&mut out, "job-after");
    dead.drain(Duration::from_millis(500));
    assert_eq!(dead.seen.len(), 2, "{:#?}", dead.seen);
    assert_serving(&w);
    w.shutdown();
}

/// `report` signed with the world's agent key, as an agent sends it.
fn sealed(w: &World, report: Value) -> Vec<u8> {
    let ring = Keyring::load(&w.agent_keys()).expect("the world's agent keys");
    envelope::seal(ring.first(), Direction::Report, report.to_string()).into_bytes()
}

/// A node 0 result without a report (its launcher failed) for `run_id`, from `agent-1`.
fn result(w: &World, node: &str, run_id: &str, error: &str) -> Vec<u8> {
    let r = json!({
        "version": 1, "node": node, "agent_id": "agent-1", "at": chrono::Utc::now(),
        "type": "Result", "run_id": run_id, "node_rank": 0, "exit_code": 4, "error": error,
    });
    sealed(w, r)
}

/// A run of `job` on node `pg-a`, whose agent `agent-1` (its heartbeat sent by the test) got
/// node 0's task: its results are accepted.
fn held_run(w: &World, out: &mut Reader, tasks: &mut Reader, event: &str, job: &str) -> String {
    let beat = json!({
        "version": 1, "node": "pg-a", "agent_id": "agent-1", "at": chrono::Utc::now(),
        "type": "Heartbeat", "address": "127.0.0.1",
    });
    w.publish_on("agent-reports", &sealed(w, beat));
    w.publish(allocated(event, job, &["pg-a"], "").as_bytes());
    let run = started_run(out, job);
    tasks.wait_for(WAIT, "node 0's task", |v| v["payload"].as_str().is_some_and(|p| p.contains(&run)));
    run
}

fn failed(out: &mut Reader, job: &str) -> Value {
    out.wait_for(WAIT, "CheckFailed", |v| v["type"] == "CheckFailed" && v["job_id"] == job)
}

#[test]
fn poison_agent_reports_become_dead_letters_on_postgresql() {
    let _g = svc::common::serial();
    let mut w = pg_world("gpusanity_poison_reports", "agent_timeout_s = 60.0\nagent_wait_s = 60.0");
    let mut out = w.reader("check-events");
    let mut dead = w.reader("dead-letter");
    let mut tasks = w.reader("agent-tasks");
    refuse_rows(&w, "findings", "message", "refuse-me", "23514");

    // A NUL in the launcher's error line, which the findings and the summary would store.
    let run1 = held_run(&w, &mut out, &mut tasks, "r-1", "job-r1");
    w.publish_on("agent-reports", &result(&w, "pg-a", &run1, "bad\u{0}line"));
    let dl = dead.wait_for(WAIT, "the NUL's dead letter", |v| v["topic"] == w.topic("agent-reports"));
    assert_eq!(dl["reason"], "bad `error`: holds a NUL character (byte 3)", "{dl:#}");
    let f = failed(&mut out, "job-r1");
    assert_eq!(f["reason"], "error", "{f:#}");
    assert_eq!(w.sql(&format!("SELECT code FROM findings WHERE run_id = '{run1}'")), ["DATA_PLANE_ERROR"]);

    // Refused by the database: the finding the result makes is refused by the trigger.
    let run2 = held_run(&w, &mut out, &mut tasks, "r-2", "job-r2");
    w.publish_on("agent-reports", &result(&w, "pg-a", &run2, "please refuse-me"));
    let dl = dead.wait_for(WAIT, "the database's dead letter", |v| {
        v["reason"].as_str().is_some_and(|r| r.starts_with("refused by the database"))
    });
    assert!(dl["reason"].as_str().is_some_and(|r| r.contains("a test trigger")), "{dl:#}");
    assert_eq!(failed(&mut out, "job-r2")["reason"], "error");

    // A later good report is handled: the run ends with the launcher's error.
    let run3 = held_run(&w, &mut out, &mut tasks, "r-3", "job-r3");
    w.publish_on("agent-reports", &result(&w, "pg-a", &run3, "the launcher failed"));
    let f = failed(&mut out, "job-r3");
    assert!(f["summary"].as_str().is_some_and(|s| s.contains("the launcher failed")), "{f:#}");
    dead.drain(Duration::from_millis(300));
    assert_eq!(dead.seen.len(), 2, "{:#?}", dead.seen);
    assert_serving(&w);
    w.shutdown();
}

/// GET `path` on the service; (status, body).
fn get(w: &World, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.http)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("write");
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_string())
}

#[test]
fn a_forged_stored_report_gets_an_error_page_and_serve_goes_on() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "agent_wait_s = 1.0");
    let cfg = std::fs::read_to_string(&w.config).expect("config");
    std::fs::write(&w.config, cfg.replace("[http]\n", "[http]\nbrowser_public = true\n")).expect("config");
    w.serve();
    let mut out = w.reader("check-events");
    w.publish(allocated("f-1", "job-forged", &["ghost"], "").as_bytes());
    let run_id = started_run(&mut out, "job-forged");
    failed(&mut out, "job-forged");
    let mut report: Value =
        serde_json::from_str(include_str!("../../docs/examples/report-cpu.json")).expect("example report");
    report["pair_bandwidth"][0]["nodes"] = json!([u64::MAX, 0]);
    let text = report.to_string().replace('\'', "''");
    w.sql(&format!("UPDATE runs SET report = '{text}' WHERE run_id = '{run_id}'"));
    for _ in 0..3 {
        let (code, body) = get(&w, &format!("/ui/runs/{run_id}"));
        assert_eq!(code, 422, "{body}");
        assert!(body.contains("cannot be shown") && body.contains("out of range"), "{body}");
        assert_serving(&w);
    }
    let (code, body) = get(&w, "/ui/runs");
    assert!(code == 200 && body.contains(&run_id), "{body}");
    // The example itself renders.
    let text = include_str!("../../docs/examples/report-cpu.json").replace('\'', "''");
    w.sql(&format!("UPDATE runs SET report = '{text}' WHERE run_id = '{run_id}'"));
    assert_eq!(get(&w, &format!("/ui/runs/{run_id}")).0, 200);
    w.shutdown();
}
