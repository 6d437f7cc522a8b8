//! Notification rules through the API, and webhook deliveries from a real `gpusanity serve` to
//! local HTTP receivers: every format, the signature, retries, and dead receivers that slow
//! nobody else.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use svc::notify::{refused_port, Mode, Receiver};
use svc::{allocated, World, TOKEN};

/// A job naming a node with no agent fails after agent_wait_s (NO_AGENT): a CheckFailed in 1 s.
const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 1.0\ndeadline_grace_s = 10.0";
const NOTIFIER: &str =
    "poll_ms = 100\nbackoff_base_s = 0.3\nbackoff_max_s = 1.0\nwebhook_timeout_s = 3.0\nmax_attempts = 4";

#[test]
fn rules_api_round_trip_needs_the_token_and_rejects_bad_rules() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    // The rule below is changed to a webhook on 10.0.0.1, a private address.
    w.notifier("webhook_allow = [\"127.0.0.0/8\", \"10.0.0.0/8\"]");
    w.serve();
    let base = "/v1/workspaces/ws-a/notification-rules";
    let rule = json!({ "name": "oncall", "channels": [
        { "type": "webhook", "url": "https://hooks.example.org/x", "format": "slack", "secret": "s3cret" },
        { "type": "email", "to": ["ops@example.org"] } ] });
    let call = |m: &str, p: &str, t: Option<&str>, b: Option<&Value>| {
        w.http_call(m, p, t, b.map(|b| b.to_string()).as_deref()).expect("HTTP")
    };

    // No token, a wrong token: 401 for every route.
    assert_eq!(call("POST", base, None, Some(&rule)).0, 401);
    assert_eq!(call("GET", base, Some("wrong-token-0123456789"), None).0, 401);
    assert_eq!(call("GET", "/v1/workspaces/ws-a/deliveries", None, None).0, 401);
    assert_eq!(call("DELETE", &format!("{base}/x"), None, None).0, 401);

    let (code, created) = call("POST", base, Some(TOKEN), Some(&rule));
    assert_eq!(code, 201, "{created:#}");
    let id = created["rule_id"].as_str().expect("rule_id").to_string();
    assert_eq!(created["events"], json!(["CheckFailed"]), "CheckFailed is the default");
    assert_eq!(created["enabled"], true);
    assert_eq!(created["channels"][0]["secret_set"], true);
    assert!(created["channels"][0].get("secret").is_none(), "the secret is never shown: {created:#}");

    let (code, list) = call("GET", base, Some(TOKEN), None);
    assert_eq!(code, 200);
    assert_eq!(list["rules"].as_array().map(Vec::len), Some(1));
    assert_eq!(list["rules"][0]["rule_id"], id.as_str());
    let (code, one) = call("GET", &format!("{base}/{id}"), Some(TOKEN), None);
    assert_eq!((code, &one["name"]), (200, &json!("oncall")));
    // Another workspace sees neither the rule nor the list entry.
    assert_eq!(call("GET", &format!("/v1/workspaces/ws-b/notification-rules/{id}"), Some(TOKEN), None).0, 404);
    assert_eq!(call("GET", "/v1/workspaces/ws-b/notification-rules", Some(TOKEN), None).1["rules"], json!([]));

    let changed = json!({ "name": "renamed", "enabled": false, "events": ["CheckTimedOut", "NodeIsolated"],
        "channels": [ { "type": "webhook", "url": "http://10.0.0.1:9000/hook", "format": "feishu" } ] });
    let (code, upd) = call("PUT", &format!("{base}/{id}"), Some(TOKEN), Some(&changed));
    assert_eq!(code, 200, "{upd:#}");
    assert_eq!(upd["name"], "renamed");
    assert_eq!(upd["enabled"], false);
    assert_eq!(upd["events"], json!(["CheckTimedOut", "NodeIsolated"]));
    assert_eq!(
        upd["channels"],
        json!([{ "type": "webhook", "url": "http://10.0.0.1:9000/hook", "format": "feishu", "secret_set": false }])
    );
    assert_eq!(call("GET", &format!("{base}/{id}"), Some(TOKEN), None).1["name"], "renamed");
    assert_eq!(call("PUT", &format!("{base}/nope"), Some(TOKEN), Some(&changed)).0, 404);

    // Validation: one clear 400 each, with a JSON error naming the problem.
    let bad: [(Value, &str); 7] = [
        (json!({ "name": "n", "channels": [] }), "channels"),
        (json!({ "name": "n", "channels": [{ "type": "webhook", "url": "not a url" }] }), "url"),
        (json!({ "name": "n", "channels": [{ "type": "webhook", "url": "file:///etc/passwd" }] }), "http"),
        (json!({ "name": "n", "channels": [{ "type": "webhook", "url": "http://h/", "format": "teams" }] }), "teams"),
        (json!({ "name": "n", "channels": [{ "type": "email", "to": ["not-an-address"] }] }), "not-an-address"),
        (
            json!({ "name": "n", "events": ["Exploded"], "channels": [{ "type": "email", "to": ["a@b.org"] }] }),
            "Exploded",
        ),
        (json!({ "channels": [{ "type": "email", "to": ["a@b.org"] }] }), "name"),
    ];
    for (body, word) in bad {
        let (code, err) = call("POST", base, Some(TOKEN), Some(&body));
        assert_eq!(code, 400, "{body} -> {err:#}");
        assert!(err["error"].as_str().unwrap_or("").contains(word), "{body}: error does not name `{word}`: {err:#}");
        assert_eq!(call("PUT", &format!("{base}/{id}"), Some(TOKEN), Some(&body)).0, 400);
    }
    let (code, err) = w.http_call("POST", base, Some(TOKEN), Some("{not json")).expect("HTTP");
    assert_eq!(code, 400, "{err:#}");
    assert_eq!(call("GET", "/v1/workspaces/ws-a/deliveries?status=lost", Some(TOKEN), None).0, 400);
    assert_eq!(call("GET", "/v1/workspaces/ws-a/deliveries", Some(TOKEN), None).1, json!({ "deliveries": [] }));

    assert_eq!(call("DELETE", &format!("{base}/{id}"), Some(TOKEN), None).0, 204);
    assert_eq!(call("GET", &format!("{base}/{id}"), Some(TOKEN), None).0, 404);
    assert_eq!(call("DELETE", &format!("{base}/{id}"), Some(TOKEN), None).0, 404);
    w.shutdown();
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("hmac");
    mac.update(msg);
    mac.finalize().into_bytes().to_vec()
}

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn signature(secret: &str, t: &str, body: &[u8]) -> String {
    hex::encode(hmac(secret.as_bytes(), &[format!("{t}.").as_bytes(), body].concat()))
}

#[test]
fn webhooks_in_every_format_signed_retried_and_not_slowed_by_dead_receivers() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.notifier(NOTIFIER);
    w.serve();
    let good = Receiver::start(None, Mode::Ok);
    let flaky = Receiver::start(None, Mode::FailFirst(2));
    let hang = Receiver::start(None, Mode::Hang);
    let gone = Receiver::start(None, Mode::Status(410));
    let refused = format!("http://127.0.0.1:{}/r", refused_port());
    let hook = |url: String, format: &str| json!({ "type": "webhook", "url": url, "format": format });
    // The dead receivers' rule comes first, so their deliveries are due before the healthy ones.
    w.rule("ws-1", json!({ "name": "dead", "channels": [hook(hang.url("/h"), "generic"), hook(refused.clone(), "generic"), hook(gone.url("/g"), "generic")] }));
    w.rule("ws-1", json!({ "name": "signed", "channels": [{ "type": "webhook", "url": good.url("/generic"), "secret": "s3cret" }] }));
    w.rule(
        "ws-1",
        json!({ "name": "chat", "events": ["CheckFailed", "CheckTimedOut"], "channels": [
        { "type": "webhook", "url": good.url("/dingtalk?access_token=T"), "format": "dingtalk", "secret": "ding-sec" },
        hook(good.url("/slack"), "slack"),
        { "type": "webhook", "url": good.url("/feishu"), "format": "feishu", "secret": "fei-sec" }] }),
    );
    w.rule("ws-1", json!({ "name": "flaky", "channels": [hook(flaky.url("/f"), "generic")] }));
    w.rule(
        "ws-1",
        json!({ "name": "isolated", "events": ["NodeIsolated"], "channels": [hook(good.url("/isolated"), "generic")] }),
    );
    // None of these may fire: disabled, another event type, another workspace.
    w.rule("ws-1", json!({ "name": "off", "enabled": false, "channels": [hook(good.url("/off"), "generic")] }));
    w.rule("ws-1", json!({ "name": "passes", "events": ["CheckPassed", "CheckTimedOut"], "channels": [hook(good.url("/passed"), "generic")] }));
    w.rule("ws-2", json!({ "name": "other", "channels": [hook(good.url("/other"), "generic")] }));

    let mut out = w.reader("check-events");
    w.publish(allocated("hook-1", "job-hook", &["ghost-1"], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    let seen = Instant::now();
    assert_eq!(failed["type"], "CheckFailed", "{failed:#}");
    let run_id = failed["run_id"].as_str().expect("run_id");

    // The healthy receiver has all five within 2 s, while the hanging one still holds its request.
    let reqs = good.wait_for(5, Duration::from_secs(2));
    assert!(seen.elapsed() < Duration::from_secs(2), "healthy deliveries took {:?}", seen.elapsed());
    assert!(!hang.requests().is_empty(), "the hanging receiver was never tried");
    let paths: std::collections::BTreeSet<&str> = reqs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/dingtalk", "/feishu", "/generic", "/isolated", "/slack"].into_iter().collect());

    let generic = &good.on("/generic")[0];
    let g = generic.json();
    assert_eq!(generic.header("content-type"), "application/json");
    assert_eq!(generic.header("x-gpusanity-event"), "CheckFailed");
    assert_eq!(g["event_type"], "CheckFailed");
    assert_eq!(g["verdict"], "failed");
    assert_eq!(g["reason"], "check_failed");
    assert_eq!(g["workspace_id"], "ws-1");
    assert_eq!(g["job_id"], "job-hook");
    assert_eq!(g["run_id"], run_id);
    assert_eq!(g["faulty_nodes"], json!(["ghost-1"]));
    assert!(g["summary"].as_str().unwrap_or("").contains("ghost-1"), "{g:#}");
    assert_eq!(g["report_url"], failed["report_url"]);
    assert!(g["report_url"].as_str().unwrap_or("").contains(run_id));
    assert_eq!(g["event"]["event_id"], failed["event_id"]);
    let key = generic.header("idempotency-key");
    assert!(key.starts_with("gsn-") && g["idempotency_key"] == key, "{key} / {g:#}");
    // The signature: t=<unix>,v1=<hex HMAC-SHA256("<t>.<body>")>, recomputed here.
    let sig = generic.header("x-gpusanity-signature");
    let (t, v1) = sig.split_once(",v1=").expect("t=..,v1=..");
    let t = t.strip_prefix("t=").expect("t=");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(now.abs_diff(t.parse::<u64>().expect("t")) < 60, "{sig}");
    assert_eq!(v1, signature("s3cret", t, &generic.body), "signature mismatch: {sig}");
    assert_ne!(v1, signature("wrong", t, &generic.body));
    let mut tampered = generic.body.clone();
    tampered[0] = b' ';
    assert_ne!(v1, signature("s3cret", t, &tampered));
    assert!(good.on("/slack")[0].header("x-gpusanity-signature").is_empty(), "unsigned without a secret");

    // DingTalk's own signature in the query: base64(HMAC-SHA256(secret, "<ms>\n<secret>")).
    let ding = &good.on("/dingtalk")[0];
    let q: std::collections::HashMap<String, String> =
        ding.query.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
    assert_eq!(q["access_token"], "T", "{q:?}");
    let ms: u64 = q["timestamp"].parse().expect("timestamp");
    assert!((now * 1000).abs_diff(ms) < 60_000, "{q:?}");
    let sign = b64(&hmac(b"ding-sec", format!("{ms}\nding-sec").as_bytes()))
        .replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D");
    assert_eq!(q["sign"], sign, "{q:?}");
    let d = ding.json();
    assert_eq!(d["msgtype"], "markdown");
    let text = d["markdown"]["text"].as_str().unwrap_or("");
    assert!(
        // Names from outside are escaped for markdown (notifier/src/escape.rs).
        text.contains("Faulty nodes: ghost\\-1")
            && text.contains("job\\-hook")
            && text.contains(&format!("({})", g["report_url"].as_str().unwrap())),
        "{d:#}"
    );
    let s = good.on("/slack")[0].json();
    assert!(s["text"].as_str().unwrap_or("").contains("ghost-1"), "{s:#}");
    assert_eq!(s["blocks"][0]["type"], "header");
    assert!(s["blocks"][1]["text"]["text"].as_str().unwrap_or("").contains("Verdict: failed"), "{s:#}");
    let f = good.on("/feishu")[0].json();
    assert_eq!(f["msg_type"], "post");
    // Feishu's own signature in the body: base64(HMAC-SHA256 keyed with "<s>\n<secret>", of nothing).
    let ts = f["timestamp"].as_str().expect("timestamp");
    assert_eq!(f["sign"], b64(&hmac(format!("{ts}\nfei-sec").as_bytes(), b"")), "{f:#}");
    let post = &f["content"]["post"]["en_us"];
    assert!(post["title"].as_str().unwrap_or("").contains("job-hook"), "{f:#}");
    assert_eq!(
        post["content"].as_array().and_then(|c| c.last()).map(|l| l[0]["href"].clone()),
        Some(g["report_url"].clone())
    );
    // NodeIsolated for the node without an agent, linked to the run's report by the template.
    let iso = good.on("/isolated")[0].json();
    assert_eq!(good.on("/isolated")[0].header("x-gpusanity-event"), "NodeIsolated");
    assert_eq!((&iso["event_type"], &iso["verdict"]), (&json!("NodeIsolated"), &json!("node isolated")), "{iso:#}");
    assert_eq!((&iso["faulty_nodes"], &iso["codes"]), (&json!(["ghost-1"]), &json!(["NO_AGENT"])), "{iso:#}");
    assert_eq!(iso["report_url"], g["report_url"]);
    // Five different deliveries, five different keys.
    let keys: std::collections::HashSet<&str> = reqs.iter().map(|r| r.header("idempotency-key")).collect();
    assert_eq!(keys.len(), 5);

    // The flaky receiver: two 500s, then one success, all under one key; the log shows each try.
    let tries = flaky.wait_for(3, Duration::from_secs(10));
    assert_eq!(tries.iter().map(|r| r.answered).collect::<Vec<_>>(), [Some(500), Some(500), Some(200)]);
    assert!(tries.iter().all(|r| r.header("idempotency-key") == tries[0].header("idempotency-key")));
    assert!(tries[1].at - tries[0].at >= Duration::from_millis(200), "no backoff between tries");
    let log = w.wait_deliveries("ws-1", Duration::from_secs(10), "flaky sent, 410 failed, refused failed", |d| {
        let by = |url: &str| d.iter().find(|x| x["target"] == url).map(|x| x["status"].clone());
        by(&flaky.url("/f")) == Some(json!("sent"))
            && by(&gone.url("/g")) == Some(json!("failed"))
            && by(&refused) == Some(json!("failed"))
    });
    let entry = |url: &str| log.iter().find(|x| x["target"] == url).cloned().expect("delivery");
    let fl = entry(&flaky.url("/f"));
    assert_eq!(fl["attempts"], 3);
    let codes: Vec<Value> = fl["attempt_log"].as_array().unwrap().iter().map(|a| a["status_code"].clone()).collect();
    assert_eq!(codes, [json!(500), json!(500), json!(200)]);
    assert_eq!(fl["idempotency_key"], tries[0].header("idempotency-key"));
    // 410: a retry would not help, one attempt. Refused: retried up to max_attempts, then failed.
    let gn = entry(&gone.url("/g"));
    assert_eq!(gn["attempts"], 1, "{gn:#}");
    assert!(gn["last_error"].as_str().unwrap_or("").contains("410"), "{gn:#}");
    assert_eq!(gone.requests().len(), 1);
    let rf = entry(&refused);
    assert_eq!(rf["attempts"], 4, "{rf:#}");
    assert!(!rf["last_error"].as_str().unwrap_or("").is_empty());
    assert_ne!(entry(&hang.url("/h"))["status"], "sent");
    assert!(
        good.on("/off").is_empty() && good.on("/passed").is_empty() && good.on("/other").is_empty(),
        "{:#?}",
        good.requests()
    );
    assert_eq!(log.len(), 9, "3 dead + 1 signed + 3 chat + 1 flaky + 1 isolated: {log:#?}");
    assert!(w.deliveries("ws-2").is_empty());
    w.shutdown();
}

#[test]
fn a_timed_out_run_goes_to_a_timeout_rule_and_not_to_a_pass_rule() {
    let _g = svc::common::serial();
    let (mut w, mut out) =
        World::running("agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0", &["to-a", "to-b"]);
    let good = Receiver::start(None, Mode::Ok);
    let hook = |path: &str| json!([{ "type": "webhook", "url": good.url(path), "format": "generic" }]);
    w.rule("ws-1", json!({ "name": "timeouts", "events": ["CheckTimedOut"], "channels": hook("/timeouts") }));
    w.rule("ws-1", json!({ "name": "passes", "events": ["CheckPassed"], "channels": hook("/passes") }));
    // Rank 1 (node to-b) hangs in its first test; the per-test limit is 3 s.
    let args =
        "--sanity-check-timeout-per-test=0.05 --sanity-check-max-time=1 --sanity-check-envs=GPUSANITY_FAULT=hang@1";
    w.allocate("tmo-1", "job-tmo", args);
    let end = out
        .wait_for(Duration::from_secs(60), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!((&end["type"], &end["reason"]), (&json!("CheckFailed"), &json!("timed_out")), "{end:#}");
    let got = good.wait_for(1, Duration::from_secs(5));
    let t = got[0].json();
    assert_eq!(got[0].path, "/timeouts");
    assert_eq!(
        (&t["event_type"], &t["verdict"], &t["reason"]),
        (&json!("CheckFailed"), &json!("timed out"), &json!("timed_out")),
        "{t:#}"
    );
    assert_eq!(t["faulty_nodes"], json!(["to-b"]), "{t:#}");
    assert!(t["title"].as_str().unwrap_or("").contains("timed out"), "{t:#}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(good.requests().len(), 1, "{:#?}", good.requests());
    w.shutdown();
}

#[test]
fn a_passed_run_reaches_a_pass_rule_once_and_no_failure_rule() {
    let _g = svc::common::serial();
    let (mut w, mut out) =
        World::running("agent_timeout_s = 5.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0", &["ok-a", "ok-b"]);
    let good = Receiver::start(None, Mode::Ok);
    let hook = |path: &str| json!([{ "type": "webhook", "url": good.url(path), "format": "generic", "secret": "pass-secret" }]);
    w.rule("ws-1", json!({ "name": "passes", "events": ["CheckPassed"], "channels": hook("/passes") }));
    w.rule("ws-1", json!({ "name": "failures", "channels": hook("/failures") }));
    w.allocate("pass-1", "job-pass", "");
    let end = out
        .wait_for(Duration::from_secs(60), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let got = good.wait_for(1, Duration::from_secs(5));
    assert_eq!(got[0].path, "/passes");
    let t = got[0].json();
    assert_eq!(
        (&t["event_type"], &t["verdict"], &t["job_id"]),
        (&json!("CheckPassed"), &json!("passed"), &json!("job-pass")),
        "{t:#}"
    );
    assert_eq!(t["faulty_nodes"], json!([]), "{t:#}");
    let sig = got[0].header("x-gpusanity-signature");
    let (t_part, v1) = sig.split_once(",v1=").unwrap_or_default();
    let t_part = t_part.strip_prefix("t=").unwrap_or_default();
    assert_eq!(v1, signature("pass-secret", t_part, &got[0].body), "the signature over the body: {sig}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(good.requests().len(), 1, "{:#?}", good.requests());
    let log = w.deliveries("ws-1");
    assert_eq!(log.len(), 1, "{log:#?}");
    assert_eq!(log[0]["status"], "sent", "{log:#?}");
    w.shutdown();
}
