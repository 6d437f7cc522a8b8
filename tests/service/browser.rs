//! The report browser of a real `gpusanity serve` with agents: pages rendered by headless
//! Chromium (Debian's `chromium`; skipped, saying why, where it is missing), the login cookie,
//! and the JSON API with its OpenAPI document.

use gpusanity_testkit::svc;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use svc::{allocated, World, TOKEN};

mod chrome;
mod node_page;
use chrome::{chromium, dom, screenshot};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";
const HOSTILE: &str = "<script>alert(1)</script>\"'&";
/// The hostile job name as the serialized DOM shows its text.
const HOSTILE_TEXT: &str = "&lt;script&gt;alert(1)&lt;/script&gt;\"'&amp;";

/// One HTTP/1.1 request; (status, head, body).
pub(crate) fn http(port: u16, method: &str, path: &str, extra_headers: &str, body: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra_headers}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

pub(crate) fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// Asserts that a browser response carries the security headers: a policy that forbids script
/// and framing, nosniff, a referrer policy, and no caching.
pub(crate) fn assert_secured(what: &str, head: &str) {
    let csp = header(head, "content-security-policy").unwrap_or_else(|| panic!("{what}: no CSP\n{head}"));
    let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
    for d in ["default-src 'none'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"] {
        assert!(directives.contains(&d), "{what}: `{d}` missing from `{csp}`");
    }
    assert!(!csp.contains("script-src") && !csp.contains("unsafe-eval"), "{what}: the policy allows script: {csp}");
    let expected = [
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ];
    for (name, value) in expected {
        assert_eq!(header(head, name), Some(value), "{what}: {name}\n{head}");
    }
}

/// The value of a form's hidden `csrf` field in a page.
pub(crate) fn csrf_field(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").map(|i| i + "name=\"csrf\" value=\"".len());
    at.and_then(|i| body[i..].split('"').next()).unwrap_or_default().to_string()
}

/// Opens the login form: the `Cookie:` header line of its CSRF cookie, and its CSRF field.
pub(crate) fn login_form(port: u16) -> (String, String) {
    let (code, head, body) = http(port, "GET", "/ui/login", "", "");
    assert_eq!(code, 200, "{head}");
    let cookie = header(&head, "set-cookie").expect("the login form's cookie");
    let pair = cookie.split(';').next().expect("name=value");
    (format!("Cookie: {pair}\r\n"), csrf_field(&body))
}

/// Posts the login form with `token`; (status, head, body).
pub(crate) fn login(port: u16, token: &str) -> (u16, String, String) {
    let (cookie, csrf) = login_form(port);
    http(port, "POST", "/ui/login", &cookie, &format!("token={token}&csrf={csrf}"))
}

fn api(w: &World, path: &str) -> (u16, Value) {
    w.http_call("GET", path, Some(TOKEN), None).expect("HTTP")
}

/// The number of runs in a rendered runs list.
fn rows(dom: &str) -> usize {
    dom.matches("<tr class=\"run\">").count()
}

/// Publishes an allocation of `nodes` in workspace `ws`.
fn publish_job(w: &World, event: &str, job: &str, nodes: &[&str], ws: &str, args: &str) {
    let mut ev: Value = serde_json::from_str(&allocated(event, job, nodes, args)).expect("event");
    ev["workspace_id"] = ws.into();
    w.publish(ev.to_string().as_bytes());
}

/// The job's verdict event.
fn verdict(out: &mut svc::Reader, job: &str) -> Value {
    out.wait_for(Duration::from_secs(90), "the verdict", |v| {
        v["job_id"] == job && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    })
}

#[test]
fn browser_pages_render_in_chromium_and_the_api_filters_runs() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let cfg = std::fs::read_to_string(&w.config).expect("config");
    std::fs::write(&w.config, cfg.replace("[http]\n", "[http]\nbrowser_public = true\n")).expect("config");
    let mut out = w.start(&["node-a", "node-b"]);
    // Three runs: one node without an agent (NO_AGENT, no report), a pass, and a hostile job
    // name whose rank 1 (node-b) hangs in gemm (failed, timed out, with a report).
    // The first waits agent_wait_s for an agent that never comes, while the others run.
    publish_job(&w, "b-0", "job-ghost", &["node-a", "ghost-node"], "ws-1", "");
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.sql("SELECT run_id FROM runs").is_empty() {
        assert!(Instant::now() < deadline, "the run never stored");
        std::thread::sleep(Duration::from_millis(50));
    }
    publish_job(
        &w,
        "b-1",
        "job-pass",
        &["node-a", "node-b"],
        "ws-1",
        "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1",
    );
    let pass = verdict(&mut out, "job-pass");
    assert_eq!(pass["type"], "CheckPassed", "{pass:#}\n{}", w.log("serve"));
    let args =
        "--sanity-check-timeout-per-test=0.05 --sanity-check-max-time=1 --sanity-check-envs=GPUSANITY_FAULT=hang@1";
    publish_job(&w, "b-2", HOSTILE, &["node-a", "node-b"], "ws-2", args);
    let bad = verdict(&mut out, HOSTILE);
    assert_eq!(bad["type"], "CheckFailed", "{bad:#}");
    assert_eq!(bad["faulty_nodes"], serde_json::json!(["node-b"]));
    let ghost = verdict(&mut out, "job-ghost");
    assert_eq!(ghost["type"], "CheckFailed", "{ghost:#}");
    let id = |v: &Value| v["run_id"].as_str().expect("run_id").to_string();
    let (ghost_id, pass_id, bad_id) = (id(&ghost), id(&pass), id(&bad));

    // The JSON API: filters, paging, errors, the token.
    let ids = |v: &Value| {
        v["runs"]
            .as_array()
            .map(|a| a.iter().map(|r| r["run_id"].as_str().unwrap_or("").to_string()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let (code, all) = api(&w, "/v1/runs");
    assert_eq!((code, all["total"].as_i64()), (200, Some(3)), "{all:#}");
    assert_eq!(ids(&all), [bad_id.as_str(), pass_id.as_str(), ghost_id.as_str()], "newest first");
    let (_, failed) = api(&w, "/v1/runs?state=CheckFailed");
    assert_eq!(ids(&failed), [bad_id.as_str(), ghost_id.as_str()]);
    let (_, ws2) = api(&w, "/v1/runs?workspace=ws-2");
    assert_eq!(ws2["runs"][0]["job_id"], HOSTILE);
    assert_eq!(ws2["runs"][0]["faulty_nodes"], serde_json::json!(["node-b"]));
    assert_eq!(ids(&api(&w, "/v1/runs?node=ghost-node").1), [ghost_id.as_str()]);
    assert_eq!(ids(&api(&w, "/v1/runs?node=node-b&workspace=ws-1").1), [pass_id.as_str()]);
    let (_, page2) = api(&w, "/v1/runs?per_page=1&page=2");
    assert_eq!(
        (ids(&page2), page2["total"].as_i64(), page2["page"].as_i64()),
        (vec![pass_id.clone()], Some(3), Some(2))
    );
    assert_eq!(api(&w, "/v1/runs?from=2999-01-01T00:00").1["total"], 0);
    assert_eq!(api(&w, "/v1/runs?from=2000-01-01T00:00:00Z").1["total"], 3);
    let (code, err) = api(&w, "/v1/runs?state=Passed");
    assert_eq!(code, 400);
    assert!(err["error"].as_str().unwrap_or("").contains("unknown state"), "{err:#}");
    assert_eq!(api(&w, "/v1/runs?per_page=0").0, 400);
    assert_eq!(w.http_call("GET", "/v1/runs", None, None).expect("HTTP").0, 401);
    assert_eq!(w.http_call("GET", "/v1/runs", Some("wrong-token-0123456789"), None).expect("HTTP").0, 401);
    assert_eq!(w.http_call("GET", "/v1/nodes/node-b/history", None, None).expect("HTTP").0, 401);
    assert_eq!(api(&w, "/v1/runs/no-such-run").0, 404);
    let (code, hist) = api(&w, "/v1/nodes/node-b/history");
    assert_eq!((code, hist["total"].as_i64()), (200, Some(2)), "{hist:#}");
    assert_eq!(hist["history"][0]["run_id"], bad_id.as_str());
    assert_eq!(hist["history"][0]["healthy"], false);
    assert_eq!(hist["history"][1]["healthy"], true);
    let (_, gh) = api(&w, "/v1/nodes/ghost-node/history");
    assert_eq!(gh["history"][0]["codes"], serde_json::json!(["NO_AGENT"]), "{gh:#}");
    assert_eq!(api(&w, "/v1/nodes/never-seen/history").1["total"], 0);
    let (code, doc) = api(&w, "/v1/openapi.json");
    assert_eq!(code, 200);
    assert!(doc["openapi"].as_str().unwrap_or("").starts_with("3.1"), "{doc:#}");
    for p in [
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/report",
        "/v1/runs/{run_id}/resolve",
        "/v1/nodes/{name}/history",
        "/v1/openapi.json",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing from the OpenAPI document");
    }
    assert!(doc["components"]["schemas"]["RunListRow"]["properties"]["faulty_nodes"].is_object(), "{doc:#}");
    assert_eq!(w.http_call("GET", "/v1/openapi.json", None, None).expect("HTTP").0, 401);
    // Public pages: no login, the API keeps its token.
    assert_eq!(http(w.http, "GET", "/ui/runs", "", "").0, 200);
    for path in [format!("/ui/runs/{bad_id}"), format!("/ui/runs/{ghost_id}"), "/ui/nodes/node-b".into()] {
        let (code, head, _) = http(w.http, "GET", &path, "", "");
        assert_eq!(code, 200, "{path}: {head}");
        assert_secured(&path, &head);
    }

    let Some(bin) = chromium() else { return w.shutdown() };
    let list = dom(&bin, &w, "/ui/runs");
    assert_eq!(rows(&list), 3, "{list}");
    assert!(list.contains("PASSED") && list.contains("FAILED") && list.contains("job-pass"), "{list}");
    assert!(list.contains(HOSTILE_TEXT), "the hostile job name is not shown as text:\n{list}");
    assert!(!list.contains("<script"), "a <script> element in the runs list:\n{list}");
    assert!(list.contains(">ghost-node</a>") && list.contains("class=\"health-faulty\""), "{list}");
    let only_passed = dom(&bin, &w, "/ui/runs?state=CheckPassed");
    assert_eq!(rows(&only_passed), 1, "{only_passed}");
    assert!(
        only_passed.contains("job-pass") && !only_passed.contains("alert(1)") && !only_passed.contains("job-ghost")
    );
    assert!(
        only_passed.contains("<option value=\"CheckPassed\" selected=\"\">"),
        "the form does not show the filter:\n{only_passed}"
    );
    let by_node = dom(&bin, &w, "/ui/runs?node=ghost-node");
    assert_eq!(rows(&by_node), 1);
    assert!(by_node.contains("job-ghost"));
    // A filter value echoed in the form is escaped too.
    let echoed = dom(&bin, &w, "/ui/runs?workspace=%22%3E%3Cscript%3Ealert(2)%3C/script%3E");
    assert_eq!(rows(&echoed), 0);
    assert!(!echoed.contains("<script") && echoed.contains("alert(2)"), "{echoed}");

    let page = dom(&bin, &w, &format!("/ui/runs/{bad_id}"));
    // The report's own verdict: rank 1 hung, so the data plane timed out (the run: CheckFailed).
    assert!(page.contains("id=\"verdict\"") && page.contains("TIMED OUT") && page.contains("TEST_HANG"), "{page}");
    assert!(page.contains(HOSTILE_TEXT) && !page.contains("<script"), "{page}");
    assert!(page.contains("Node node-b"), "the faulty node is not named:\n{page}");
    let charts = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/run.html"))
        .unwrap_or_default()
        .contains("<svg");
    if charts {
        assert!(page.contains("<svg"), "the run page has no chart:\n{page}");
    }
    let passed_page = dom(&bin, &w, &format!("/ui/runs/{pass_id}"));
    assert!(passed_page.contains("PASSED") && passed_page.contains("job-pass"), "{passed_page}");
    let ghost_page = dom(&bin, &w, &format!("/ui/runs/{ghost_id}"));
    assert!(
        ghost_page.contains("FAILED") && ghost_page.contains("NO_AGENT") && ghost_page.contains(">ghost-node</td>"),
        "{ghost_page}"
    );
    assert!(ghost_page.contains("CheckFailed") && ghost_page.contains("Checking"), "no timeline:\n{ghost_page}");
    let missing = dom(&bin, &w, "/ui/runs/no-such-run");
    assert!(missing.contains("No run"), "{missing}");

    let node = dom(&bin, &w, "/ui/nodes/node-b");
    assert_eq!(node.matches("<tr class=\"entry\">").count(), 2, "{node}");
    assert!(
        node.contains(&format!("href=\"/ui/runs/{bad_id}\"")) && node.contains(&format!("href=\"/ui/runs/{pass_id}\"")),
        "{node}"
    );
    assert!(
        node.contains("<svg id=\"health-strip\"") && node.contains(HOSTILE_TEXT) && !node.contains("<script"),
        "{node}"
    );

    let shot = screenshot(&bin, &w, "/ui/runs", "browser-runs.png");
    eprintln!("screenshots: {} and the run page beside it", shot.display());
    screenshot(&bin, &w, &format!("/ui/runs/{bad_id}"), "browser-run.png");
    w.shutdown();
}

#[test]
fn browser_login_sets_a_strict_http_only_session_cookie() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.serve();
    let port = w.http;
    let (code, head, _) = http(port, "GET", "/ui/runs", "", "");
    assert_eq!((code, header(&head, "location")), (303, Some("/ui/login")), "{head}");
    assert_secured("the redirect to the login form", &head);
    let (_, head, _) = http(port, "GET", "/", "", "");
    assert_eq!(header(&head, "location"), Some("/ui/runs"));
    assert_secured("/", &head);
    let (code, head, body) = http(port, "GET", "/ui/login", "", "");
    assert!(code == 200 && body.contains("name=\"token\""), "{body}");
    assert_secured("the login form", &head);
    let (code, head, body) = login(port, "wrong-token-0123456789");
    assert_eq!(code, 401, "{head}");
    assert_secured("a failed login", &head);
    assert!(body.contains("Wrong token") && header(&head, "set-cookie").is_none(), "{head}{body}");
    let (code, head, _) = login(port, TOKEN);
    assert_eq!((code, header(&head, "location")), (303, Some("/ui/runs")), "{head}");
    let cookie = header(&head, "set-cookie").expect("a session cookie").to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attr), "{attr} missing: {cookie}");
    }
    assert!(!cookie.contains(TOKEN), "the cookie carries the token: {cookie}");
    let session = cookie.split(';').next().expect("name=value").to_string();
    let with = format!("Cookie: {session}\r\n");
    let (code, head, body) = http(port, "GET", "/ui/runs", &with, "");
    assert!(code == 200 && body.contains("No runs match"), "{code} {body}");
    assert_secured("the runs list", &head);
    let (code, head, _) = http(port, "GET", "/ui/nodes/n1", &with, "");
    assert_eq!(code, 200);
    assert_secured("a node's page", &head);
    let (code, head, _) = http(port, "GET", "/ui/runs/no-such-run", &with, "");
    assert_eq!(code, 404);
    assert_secured("a missing run's page", &head);
    assert_eq!(http(port, "GET", "/ui/runs", "Cookie: gpusanity_session=forged\r\n", "").0, 303);
    // A bad filter: 400 with the value escaped.
    let (code, head, body) = http(port, "GET", "/ui/runs?state=%3Cscript%3E", &with, "");
    assert_eq!(code, 400);
    assert_secured("a bad filter's page", &head);
    assert!(
        body.contains("unknown state `&#60;script&#62;`") || body.contains("unknown state `&lt;script&gt;`"),
        "{body}"
    );
    assert!(!body.contains("<script>"), "{body}");
    // The cookie opens the pages, not the API.
    assert_eq!(http(port, "GET", "/v1/runs", &with, "").0, 401);
    let csrf = csrf_field(&http(port, "GET", "/ui/runs", &with, "").2);
    let (_, head, _) = http(port, "POST", "/ui/logout", &with, &format!("csrf={csrf}"));
    assert!(header(&head, "set-cookie").is_some_and(|c| c.contains("Max-Age=0")), "{head}");
    assert_secured("the logout", &head);
    w.shutdown();
}

#[test]
fn browser_queries_and_pages_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_browser");
    let mut w = World::new(Some(url), "agent_timeout_s = 2.0\nagent_wait_s = 4.0\ndeadline_grace_s = 10.0");
    let cfg = std::fs::read_to_string(&w.config).expect("config");
    std::fs::write(&w.config, cfg.replace("[http]\n", "[http]\nbrowser_public = true\n")).expect("config");
    w.serve();
    let mut out = w.reader("check-events");
    publish_job(&w, "pg-b1", "job-pg-browse", &["pg-ghost", "pg-other"], "ws-pg", "");
    // While it waits agent_wait_s for agents that never come: a run without a report yet.
    let deadline = Instant::now() + Duration::from_secs(30);
    let checking = loop {
        let (_, v) = api(&w, "/v1/runs?state=Checking");
        if let Some(id) = v["runs"][0]["run_id"].as_str() {
            break id.to_string();
        }
        assert!(Instant::now() < deadline, "the run never stored");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (code, _, page) = http(w.http, "GET", &format!("/ui/runs/{checking}"), "", "");
    assert!(code == 200 && page.contains("CHECKING") && page.contains("no report yet"), "{page}");
    assert_eq!(verdict(&mut out, "job-pg-browse")["type"], "CheckFailed");
    let (_, runs) = api(&w, "/v1/runs?node=pg-other&state=CheckFailed&workspace=ws-pg");
    assert_eq!(
        (runs["total"].as_i64(), &runs["runs"][0]["faulty_nodes"]),
        (Some(1), &serde_json::json!(["pg-ghost", "pg-other"])),
        "{runs:#}"
    );
    assert_eq!(api(&w, "/v1/runs?node=pg-Other").1["total"], 0, "the node filter is exact");
    assert_eq!(api(&w, "/v1/runs?node=pg-ghost&to=2000-01-01T00:00").1["total"], 0);
    let (_, hist) = api(&w, "/v1/nodes/pg-ghost/history");
    assert_eq!(
        (hist["total"].as_i64(), &hist["history"][0]["codes"]),
        (Some(1), &serde_json::json!(["NO_AGENT"])),
        "{hist:#}"
    );
    let run_id = runs["runs"][0]["run_id"].as_str().expect("run_id").to_string();
    let (code, _, page) = http(w.http, "GET", &format!("/ui/runs/{run_id}"), "", "");
    assert!(code == 200 && page.contains("NO_AGENT") && page.contains("job-pg-browse"), "{page}");
    let (code, _, page) = http(w.http, "GET", "/ui/nodes/pg-other", "", "");
    assert!(code == 200 && page.contains(&format!("href=\"/ui/runs/{run_id}\"")), "{page}");
    w.shutdown();
}
