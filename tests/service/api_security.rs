//! The HTTP API and the notifier as a trust boundary, through a real `gpusanity serve`:
//! workspace tokens see only their workspace (another's runs and rules are 404), browser
//! sessions per login end at logout and expire, failed logins are limited, the forms need
//! their CSRF token, cookies are Secure when configured, and webhooks to internal addresses
//! are refused unless allowed, with nothing of a target's answer in the delivery log.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::notify::{Mode, Receiver};
use svc::{allocated, World, LOOPBACK_ALLOW, TOKEN};

use crate::browser::{csrf_field, header, http, login, login_form};

/// A job naming a node with no agent fails after agent_wait_s (NO_AGENT): a CheckFailed in 1 s.
const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 1.0\ndeadline_grace_s = 10.0";
const TOKEN_A: &str = "token-of-ws-a-0123456789";
const TOKEN_B: &str = "token-of-ws-b-0123456789";

/// Adds `lines` to [http] and `tables` (e.g. `[[http.workspace_tokens]]`) after it.
fn http_config(w: &World, lines: &str, tables: &str) {
    let text = std::fs::read_to_string(&w.config).expect("config");
    let text = text.replacen("[http]\n", &format!("[http]\n{lines}\n"), 1);
    let text = text.replacen("\n[coordinator]\n", &format!("\n{tables}\n\n[coordinator]\n"), 1);
    std::fs::write(&w.config, text).expect("config");
}

fn call(w: &World, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, Value) {
    w.http_call(method, path, Some(token), body.map(|b| b.to_string()).as_deref()).expect("HTTP")
}

/// Publishes an allocation of `node` (which has no agent) in workspace `ws`.
fn publish_job(w: &World, event: &str, job: &str, node: &str, ws: &str) {
    let mut ev: Value =
        serde_json::from_str(&allocated(event, job, &[node], "--sanity-check-max-time=1")).expect("event");
    ev["workspace_id"] = ws.into();
    w.publish(ev.to_string().as_bytes());
}

/// Waits until the admin sees `n` runs; their (job id, run id) pairs.
fn wait_runs(w: &World, n: usize) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = call(w, "GET", "/v1/runs", TOKEN, None);
        assert_eq!(code, 200, "{body:#}");
        let runs: Vec<(String, String)> = body["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|r| (r["job_id"].as_str().unwrap_or("").to_string(), r["run_id"].as_str().unwrap_or("").to_string()))
            .collect();
        if runs.len() >= n {
            return runs;
        }
        assert!(Instant::now() < deadline, "{} of {n} runs; log:\n{}", runs.len(), w.log("serve"));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_of(runs: &[(String, String)], job: &str) -> String {
    runs.iter().find(|(j, _)| j == job).map(|(_, r)| r.clone()).expect("the job's run")
}

#[test]
fn a_workspace_token_sees_only_its_workspace_and_the_admin_sees_all() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let file = w.dir.path().join("ws-b.token");
    std::fs::write(&file, format!("{TOKEN_B}\n")).expect("token file");
    http_config(
        &w,
        "secure_cookies = true",
        &format!(
            "[[http.workspace_tokens]]\nworkspace = \"ws-a\"\ntoken = \"{TOKEN_A}\"\n\n\
             [[http.workspace_tokens]]\nworkspace = \"ws-b\"\ntoken_file = \"{}\"",
            file.display()
        ),
    );
    w.serve();
    publish_job(&w, "sec-a", "job-a", "ghost-a", "ws-a");
    publish_job(&w, "sec-b", "job-b", "ghost-b", "ws-b");
    let runs = wait_runs(&w, 2);
    let (run_a, run_b) = (run_of(&runs, "job-a"), run_of(&runs, "job-b"));

    // Runs: the list is narrowed, another workspace's run is not found.
    let (code, list) = call(&w, "GET", "/v1/runs", TOKEN_A, None);
    assert_eq!((code, list["total"].as_i64()), (200, Some(1)), "{list:#}");
    assert_eq!(list["runs"][0]["run_id"], run_a.as_str());
    assert_eq!(call(&w, "GET", "/v1/runs?workspace=ws-b", TOKEN_A, None).1["total"], 0);
    assert_eq!(call(&w, "GET", &format!("/v1/runs/{run_a}"), TOKEN_A, None).0, 200);
    for path in [format!("/v1/runs/{run_b}"), format!("/v1/runs/{run_b}/report")] {
        let (code, body) = call(&w, "GET", &path, TOKEN_A, None);
        assert_eq!(code, 404, "{path}: {body:#}");
        // The same answer as for a run that does not exist.
        assert_eq!(body["error"], format!("no run `{run_b}`"), "{path}");
    }
    let verdict = json!({ "verdict": "pass" });
    assert_eq!(call(&w, "POST", &format!("/v1/runs/{run_b}/resolve"), TOKEN_A, Some(&verdict)).0, 404);
    assert_eq!(call(&w, "GET", "/v1/nodes/ghost-b/history", TOKEN_A, None).1["total"], 0);
    assert_eq!(call(&w, "GET", &format!("/v1/runs/{run_b}"), TOKEN_B, None).0, 200, "the token from the file");
    // The admin sees both.
    assert_eq!(call(&w, "GET", "/v1/runs", TOKEN, None).1["total"], 2);
    assert_eq!(call(&w, "GET", &format!("/v1/runs/{run_b}"), TOKEN, None).0, 200);

    // Rules: only in its own workspace.
    let rule = json!({ "name": "r", "channels": [{ "type": "email", "to": ["ops@example.org"] }] });
    let (code, mine) = call(&w, "POST", "/v1/workspaces/ws-a/notification-rules", TOKEN_A, Some(&rule));
    assert_eq!(code, 201, "{mine:#}");
    assert_eq!(call(&w, "POST", "/v1/workspaces/ws-b/notification-rules", TOKEN_A, Some(&rule)).0, 404);
    let (code, theirs) = call(&w, "POST", "/v1/workspaces/ws-b/notification-rules", TOKEN, Some(&rule));
    assert_eq!(code, 201, "{theirs:#}");
    let id_b = theirs["rule_id"].as_str().expect("rule_id");
    let one_b = format!("/v1/workspaces/ws-b/notification-rules/{id_b}");
    for (m, p) in [
        ("GET", one_b.as_str()),
        ("PUT", one_b.as_str()),
        ("DELETE", one_b.as_str()),
        ("GET", "/v1/workspaces/ws-b/notification-rules"),
        ("GET", "/v1/workspaces/ws-b/deliveries"),
    ] {
        assert_eq!(call(&w, m, p, TOKEN_A, Some(&rule)).0, 404, "{m} {p}");
    }
    assert_eq!(call(&w, "GET", &one_b, TOKEN_B, None).0, 200);
    assert_eq!(call(&w, "GET", &one_b, TOKEN, None).0, 200, "the admin sees it");
    let id_a = mine["rule_id"].as_str().expect("rule_id");
    assert_eq!(call(&w, "GET", &format!("/v1/workspaces/ws-a/notification-rules/{id_a}"), TOKEN, None).0, 200);

    // The browser: a workspace login sees its runs only; the cookie is Secure as configured.
    let (code, head, _) = login(w.http, TOKEN_A);
    assert_eq!(code, 303, "{head}");
    let cookie = header(&head, "set-cookie").expect("session cookie").to_string();
    assert!(cookie.contains("Secure"), "{cookie}");
    let with = format!("Cookie: {}\r\n", cookie.split(';').next().unwrap_or_default());
    let (code, _, body) = http(w.http, "GET", "/ui/runs", &with, "");
    assert!(code == 200 && body.contains("job-a") && !body.contains("job-b"), "{code} {body}");
    assert_eq!(http(w.http, "GET", &format!("/ui/runs/{run_b}"), &with, "").0, 404);
    assert_eq!(http(w.http, "GET", &format!("/ui/runs/{run_a}"), &with, "").0, 200);
    w.shutdown();
}

#[test]
fn sessions_end_at_logout_and_expire_forms_need_csrf_and_failed_logins_are_limited() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    http_config(&w, "session_ttl_s = 1", "");
    w.serve();
    let port = w.http;
    let session = |head: &str| {
        let c = header(head, "set-cookie").expect("session cookie");
        assert!(c.contains("Max-Age=1") && !c.contains("Secure"), "{c}");
        format!("Cookie: {}\r\n", c.split(';').next().unwrap_or_default())
    };

    // CSRF: a login without the form's token, with a token but no cookie, or from another site.
    let (form_cookie, csrf) = login_form(port);
    assert_eq!(csrf.len(), 64);
    assert_eq!(http(port, "POST", "/ui/login", &form_cookie, &format!("token={TOKEN}")).0, 403);
    assert_eq!(http(port, "POST", "/ui/login", "", &format!("token={TOKEN}&csrf={csrf}")).0, 403);
    let evil = format!("{form_cookie}Origin: http://evil.example\r\n");
    assert_eq!(http(port, "POST", "/ui/login", &evil, &format!("token={TOKEN}&csrf={csrf}")).0, 403);

    // One session per login; logout ends it, so the old cookie opens nothing.
    let (code, head, _) = login(port, TOKEN);
    assert_eq!(code, 303, "{head}");
    let first = session(&head);
    let (_, head, _) = login(port, TOKEN);
    let second = session(&head);
    assert_ne!(first, second, "each login has its own session");
    let (code, _, runs) = http(port, "GET", "/ui/runs", &first, "");
    assert_eq!(code, 200);
    let token = csrf_field(&runs);
    assert_eq!(http(port, "POST", "/ui/logout", &first, "").0, 403, "logout without the CSRF token");
    assert_eq!(http(port, "POST", "/ui/logout", &first, "csrf=forged").0, 403);
    assert_eq!(http(port, "GET", "/ui/runs", &first, "").0, 200, "a refused logout ends nothing");
    let (code, head, _) = http(port, "POST", "/ui/logout", &first, &format!("csrf={token}"));
    assert_eq!((code, header(&head, "location")), (303, Some("/ui/login")), "{head}");
    let (code, head, _) = http(port, "GET", "/ui/runs", &first, "");
    assert_eq!((code, header(&head, "location")), (303, Some("/ui/login")), "the old cookie after logout");
    assert_eq!(http(port, "GET", "/ui/runs", &second, "").0, 200, "the other session lives on");

    // Expiry: a second later the session is gone.
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(http(port, "GET", "/ui/runs", &second, "").0, 303, "expired");

    // X-Forwarded-Proto: https from a proxy makes the cookie Secure.
    let (c, t) = login_form(port);
    let (_, head, _) = http(
        port,
        "POST",
        "/ui/login",
        &format!("{c}X-Forwarded-Proto: https\r\n"),
        &format!("token={TOKEN}&csrf={t}"),
    );
    assert!(header(&head, "set-cookie").is_some_and(|c| c.contains("Secure")), "{head}");

    // Five wrong tokens are 401, the sixth 429 with Retry-After, and so is the right one now.
    for i in 0..5 {
        assert_eq!(login(port, "wrong-token-0123456789").0, 401, "attempt {i}");
    }
    let (code, head, _) = login(port, "wrong-token-0123456789");
    assert_eq!(code, 429, "{head}");
    let wait: u64 = header(&head, "retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(login(port, TOKEN).0, 429);
    // The API's bearer token is not a login: it still works.
    assert_eq!(w.http_call("GET", "/v1/runs", Some(TOKEN), None).expect("HTTP").0, 200);
    w.shutdown();
}

#[test]
fn webhooks_to_internal_addresses_are_refused_unless_allowed_and_answers_are_not_logged() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.notifier("webhook_allow = []\npoll_ms = 100\nbackoff_base_s = 0.2\nbackoff_max_s = 0.5\nwebhook_timeout_s = 3.0\nmax_attempts = 2");
    w.serve();
    let rules = "/v1/workspaces/ws-1/notification-rules";
    let hook = |url: String| json!({ "name": "h", "channels": [{ "type": "webhook", "url": url }] });

    // A literal internal address is refused when the rule is made.
    for (url, word) in [
        ("http://127.0.0.1:9/x", "loopback"),
        ("http://[::1]:9/x", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://10.1.2.3/x", "private"),
        // IPv4 inside IPv6 (NAT64, IPv4-compatible, 6to4) and the reserved ranges.
        ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),
        ("http://[::127.0.0.1]/", "loopback"),
        ("http://[2002:a9fe:a9fe::1]/", "metadata"),
        ("http://198.18.0.1/", "reserved"),
        ("http://240.0.0.1/", "reserved"),
    ] {
        let (code, body) = call(&w, "POST", rules, TOKEN, Some(&hook(url.into())));
        assert_eq!(code, 400, "{url}: {body:#}");
        let err = body["error"].as_str().unwrap_or("");
        assert!(err.contains("blocked") && err.contains(word), "{url}: {err}");
    }

    // A name that resolves to loopback is refused when the delivery connects.
    let receiver = Receiver::start(None, Mode::Ok);
    let by_name = format!("http://localhost:{}/hook", receiver.port);
    w.rule("ws-1", hook(by_name.clone()));
    let mut out = w.reader("check-events");
    w.publish(allocated("ssrf-1", "job-ssrf-1", &["ghost-1"], "--sanity-check-max-time=1").as_bytes());
    out.wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed");
    let log = w.wait_deliveries("ws-1", Duration::from_secs(10), "the blocked delivery failed", |d| {
        d.iter().any(|e| e["status"] == "failed")
    });
    let err = log[0]["last_error"].as_str().unwrap_or("");
    assert!(err.starts_with("blocked: loopback address"), "{:#}", log[0]);
    assert!(receiver.requests().is_empty(), "the blocked target was reached");

    // With loopback allowed, the name is delivered; a failing target's answer is not kept.
    w.kill("serve");
    w.edit_config("webhook_allow = []", LOOPBACK_ALLOW);
    w.serve();
    const ANSWER: &str = "internal-answer-do-not-echo-4711";
    let failing = Receiver::start(None, Mode::Body(500, ANSWER));
    let refusing = Receiver::start(None, Mode::Body(403, ANSWER));
    w.rule("ws-1", hook(failing.url("/f")));
    w.rule("ws-1", hook(refusing.url("/r")));
    w.publish(allocated("ssrf-2", "job-ssrf-2", &["ghost-2"], "--sanity-check-max-time=1").as_bytes());
    receiver.wait_for(1, Duration::from_secs(30));
    let log = w.wait_deliveries("ws-1", Duration::from_secs(20), "all deliveries ended", |d| {
        d.len() >= 4 && d.iter().all(|e| e["status"] != "pending")
    });
    let entry = |target: &str| {
        log.iter()
            .find(|e| e["target"] == target)
            .cloned()
            .unwrap_or_else(|| panic!("no delivery to {target}: {log:#?}"))
    };
    let sent = log.iter().filter(|e| e["target"] == by_name.as_str() && e["status"] == "sent").count();
    assert_eq!(sent, 1, "{log:#?}");
    let f = entry(&failing.url("/f"));
    assert_eq!((f["status"].as_str(), f["last_error"].as_str()), (Some("failed"), Some("HTTP 500")), "{f:#}");
    let r = entry(&refusing.url("/r"));
    assert_eq!((r["status"].as_str(), r["last_error"].as_str()), (Some("failed"), Some("HTTP 403")), "{r:#}");
    assert_eq!(failing.requests().len(), 2, "two attempts");
    let all = serde_json::to_string(&log).unwrap_or_default();
    assert!(!all.contains(ANSWER), "the target's answer is in the delivery log: {all}");
    w.shutdown();
}
