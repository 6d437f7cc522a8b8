//! Email notifications to a real SMTP server (aiosmtpd, scripts/smtp_sink.py) over STARTTLS
//! with a login: headers, the plain-text and HTML bodies, a hostile job name escaped.

use gpusanity_testkit::svc;

use std::time::Duration;

use serde_json::json;
use svc::notify::{mime, parts, Smtp};
use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 1.0\ndeadline_grace_s = 10.0";
const HOSTILE: &str = "<script>alert(\"x\")</script>&'job";

/// The [notifier] lines for `smtp`: STARTTLS required, its certificate trusted, a login.
fn smtp_config(smtp: &Smtp) -> String {
    format!(
        "poll_ms = 100\nbackoff_base_s = 0.3\nbackoff_max_s = 1.0\n[notifier.smtp]\nhost = \"localhost\"\nport = {}\nstarttls = \"required\"\n\
         username = \"gpusanity\"\npassword = \"mail-pass-1\"\nfrom = \"gpusanity <gpusanity@example.org>\"\nca_file = \"{}\"",
        smtp.port,
        smtp.cert().display()
    )
}

#[test]
fn a_failed_check_mails_each_recipient_both_bodies_over_starttls() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let smtp = Smtp::start(&w.dir.path().join("smtp"), "gpusanity", "mail-pass-1");
    w.notifier(&smtp_config(&smtp));
    w.serve();
    w.rule(
        "ws-1",
        json!({ "name": "mail", "channels": [{ "type": "email", "to": ["ops@example.org", "oncall@example.org"] }] }),
    );
    let mut out = w.reader("check-events");
    w.publish(allocated("mail-1", HOSTILE, &["ghost-m"], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(failed["type"], "CheckFailed");
    let report_url = failed["report_url"].as_str().expect("report_url").to_string();

    let msgs = smtp.wait_for(2, Duration::from_secs(15));
    let log = w.wait_deliveries("ws-1", Duration::from_secs(5), "both sent", |d| {
        d.len() == 2 && d.iter().all(|x| x["status"] == "sent")
    });
    let mut rcpts: Vec<String> = msgs.iter().map(|m| m["rcpt_tos"][0].as_str().unwrap_or("").to_string()).collect();
    rcpts.sort();
    assert_eq!(rcpts, ["oncall@example.org", "ops@example.org"]);
    for m in &msgs {
        assert_eq!(m["tls"], true, "STARTTLS was required");
        assert_eq!(m["login"], "gpusanity");
        assert_eq!(m["mail_from"], "gpusanity@example.org");
        let to = m["rcpt_tos"][0].as_str().unwrap();
        let (h, body) = mime(m["data"].as_str().expect("data"));
        assert_eq!(h["from"], "gpusanity <gpusanity@example.org>");
        assert_eq!(h["to"], to);
        assert!(h["subject"].contains("failed the check") && h["subject"].contains("ws-1"), "{h:#?}");
        // Message-ID: <idempotency key@sender's domain>, the key of this recipient's delivery.
        let d = log.iter().find(|d| d["target"] == to).expect("delivery of this recipient");
        assert_eq!(h["message-id"], format!("<{}@example.org>", d["idempotency_key"].as_str().unwrap()));
        assert!(h["content-type"].starts_with("multipart/alternative"), "{h:#?}");
        let p = parts(&h["content-type"], &body);
        assert_eq!(p.len(), 2, "{body}");
        let text = p
            .iter()
            .find(|(h, _)| h["content-type"].starts_with("text/plain"))
            .map(|(_, t)| t.clone())
            .expect("text part");
        let html = p
            .iter()
            .find(|(h, _)| h["content-type"].starts_with("text/html"))
            .map(|(_, t)| t.clone())
            .expect("HTML part");
        assert!(
            text.contains("Verdict: failed") && text.contains("Faulty nodes: ghost-m") && text.contains(&report_url),
            "{text}"
        );
        assert!(text.contains(HOSTILE), "the plain text carries the name as it is: {text}");
        assert!(
            html.contains("failed")
                && html.contains("<code>ghost-m</code>")
                && html.contains(&format!("href=\"{report_url}\"")),
            "{html}"
        );
        assert!(!html.contains("<script>") && !html.contains("alert(\"x\")"), "the job name is not escaped: {html}");
        assert!(html.contains("&#60;script&#62;") || html.contains("&lt;script&gt;"), "{html}");
    }
    w.shutdown();
}

#[test]
fn mail_to_a_server_that_is_down_is_retried_and_arrives_once_with_its_message_id() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let dir = w.dir.path().join("smtp");
    let first = Smtp::start(&dir, "gpusanity", "mail-pass-1");
    w.notifier(&smtp_config(&first));
    let port = first.port;
    drop(first);
    w.serve();
    w.rule("ws-1", json!({ "name": "mail", "channels": [{ "type": "email", "to": ["ops@example.org"] }] }));
    w.publish(allocated("mail-2", "job-mail-down", &["ghost-d"], "--sanity-check-max-time=1").as_bytes());
    w.wait_deliveries("ws-1", Duration::from_secs(30), "tried twice against the stopped server", |d| {
        d.len() == 1 && d[0]["status"] == "pending" && d[0]["attempts"].as_i64().unwrap_or(0) >= 2
    });
    // Up again on the same port with the same certificate.
    let smtp = Smtp::start_on(port, &dir, "gpusanity", "mail-pass-1");
    let msgs = smtp.wait_for(1, Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(smtp.messages().len(), 1, "{msgs:#?}");
    let log = w.wait_deliveries("ws-1", Duration::from_secs(5), "sent", |d| d.len() == 1 && d[0]["status"] == "sent");
    let tries = log[0]["attempt_log"].as_array().expect("attempt_log");
    assert!(tries.len() >= 3 && tries.last().map(|t| t["ok"] == true) == Some(true), "{log:#?}");
    assert!(
        tries[..tries.len() - 1].iter().all(|t| t["ok"] == false && !t["error"].as_str().unwrap_or("").is_empty()),
        "{log:#?}"
    );
    let (h, _) = mime(msgs[0]["data"].as_str().expect("data"));
    assert_eq!(h["message-id"], format!("<{}@example.org>", log[0]["idempotency_key"].as_str().unwrap()));
    assert!(h["subject"].contains("job-mail-down"), "{h:#?}");
    w.shutdown();
}
