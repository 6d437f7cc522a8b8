//! The webhook channel: the body in the receiver's format, the `Idempotency-Key` header, an
//! HMAC-SHA256 signature header when the channel has a secret, and the POST itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpusanity_common::wire::output::OutputEvent;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::notice::Notice;
use crate::rules::WebhookFormat;

/// The signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub const SIGNATURE_HEADER: &str = "X-Gpusanity-Signature";
pub const EVENT_HEADER: &str = "X-Gpusanity-Event";

/// The request body for `format`.
pub fn body(format: WebhookFormat, n: &Notice, ev: &OutputEvent, key: &str) -> Value {
    let lines = n.text_lines();
    match format {
        WebhookFormat::Generic => json!({
            "version": 1,
            "idempotency_key": key,
            "event_type": n.event_type,
            "verdict": n.verdict,
            "reason": n.reason,
            "title": n.title(),
            "workspace_id": n.workspace_id,
            "job_id": n.job_id,
            "run_id": n.run_id,
            "event_id": n.event_id,
            "at": n.at,
            "summary": n.summary,
            "faulty_nodes": n.faulty_nodes,
            "codes": n.codes,
            "report_url": n.report_url,
            "event": ev,
        }),
        WebhookFormat::Dingtalk => {
            let mut text = format!("### {}\n\n", n.title());
            text.push_str(&lines.iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n"));
            if let Some(u) = &n.report_url {
                text.push_str(&format!("\n\n[Open the report]({u})"));
            }
            json!({ "msgtype": "markdown", "markdown": { "title": n.title(), "text": text } })
        }
        WebhookFormat::Slack => {
            let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
            let title = esc(&n.title());
            let detail = lines.iter().map(|l| esc(l)).collect::<Vec<_>>().join("\n");
            let mut blocks = vec![
                json!({ "type": "header", "text": { "type": "plain_text", "text": n.title() } }),
                json!({ "type": "section", "text": { "type": "mrkdwn", "text": detail } }),
            ];
            if let Some(u) = &n.report_url {
                blocks.push(json!({ "type": "section", "text": { "type": "mrkdwn", "text": format!("<{}|Open the report>", esc(u)) } }));
            }
            json!({ "text": format!("{title}\n{detail}"), "blocks": blocks })
        }
        WebhookFormat::Feishu => {
            let mut content: Vec<Value> = lines.iter().map(|l| json!([{ "tag": "text", "text": l }])).collect();
            match &n.report_url {
                Some(u) => {
                    content.push(json!([{ "tag": "a", "text": "Open the report", "href": u }]));
                    json!({ "msg_type": "post", "content": { "post": { "en_us": { "title": n.title(), "content": content } } } })
                }
                None => {
                    json!({ "msg_type": "text", "content": { "text": format!("{}\n{}", n.title(), lines.join("\n")) } })
                }
            }
        }
    }
}

/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed with the secret>`.
pub fn signature(secret: &str, t: u64, body: &[u8]) -> String {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// How a POST ended.
pub enum Sent {
    Ok(u16),
    /// Worth another try: a network error, a timeout, 408, 429 or 5xx.
    Retry(Option<u16>, String),
    /// Another try would fail the same way (other 4xx, redirects).
    GiveUp(u16, String),
}

pub async fn post(client: &reqwest::Client, url: &str, secret: Option<&str>, key: &str, event_type: &str, body: &Value, timeout: Duration) -> Sent {
    let bytes = match serde_json::to_vec(body) {
        Ok(b) => b,
        Err(e) => return Sent::Retry(None, format!("encoding the body: {e}")),
    };
    let mut req = client
        .post(url)
        .timeout(timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", key)
        .header(EVENT_HEADER, event_type);
    if let Some(s) = secret {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        req = req.header(SIGNATURE_HEADER, signature(s, t, &bytes));
    }
    match req.body(bytes).send().await {
        Ok(resp) => {
            let code = resp.status().as_u16();
            if resp.status().is_success() {
                return Sent::Ok(code);
            }
            let text: String = resp.text().await.unwrap_or_default().chars().take(200).collect();
            let why = format!("HTTP {code}: {text}");
            if code == 408 || code == 429 || code >= 500 {
                Sent::Retry(Some(code), why)
            } else {
                Sent::GiveUp(code, why)
            }
        }
        Err(e) if e.is_timeout() => Sent::Retry(None, format!("no answer within {:.1} s", timeout.as_secs_f64())),
        Err(e) => Sent::Retry(None, error_chain(&e)),
    }
}

/// An error with its causes, `a: b: c`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::wire::output::{FailReason, OutputBody};

    fn event() -> OutputEvent {
        OutputEvent {
            version: 1,
            event_id: "out-1".into(),
            job_id: "job <b>&".into(),
            workspace_id: "ws".into(),
            run_id: Some("run-1".into()),
            cause_event_id: "in-1".into(),
            at: chrono::Utc::now(),
            body: OutputBody::CheckFailed {
                summary: "node n2 slow".into(),
                faulty_nodes: vec!["n2".into()],
                report_url: "http://r/run-1".into(),
                reason: FailReason::TimedOut,
            },
        }
    }

    #[test]
    fn every_format_names_the_verdict_the_node_and_the_link() {
        let ev = event();
        let n = Notice::from_event(&ev, "http://x/{run_id}");
        let g = body(WebhookFormat::Generic, &n, &ev, "k1");
        assert_eq!(g["event_type"], "CheckFailed");
        assert_eq!(g["verdict"], "timed out");
        assert_eq!(g["reason"], "timed_out");
        assert_eq!(g["faulty_nodes"], json!(["n2"]));
        assert_eq!(g["idempotency_key"], "k1");
        assert_eq!(g["event"]["event_id"], "out-1");
        let d = body(WebhookFormat::Dingtalk, &n, &ev, "k1");
        assert_eq!(d["msgtype"], "markdown");
        assert!(d["markdown"]["text"].as_str().unwrap().contains("Faulty nodes: n2"));
        assert!(d["markdown"]["text"].as_str().unwrap().contains("(http://r/run-1)"));
        let s = body(WebhookFormat::Slack, &n, &ev, "k1");
        assert!(s["text"].as_str().unwrap().contains("job &lt;b&gt;&amp;"), "{s}");
        assert_eq!(s["blocks"][0]["type"], "header");
        assert!(s["blocks"][2]["text"]["text"].as_str().unwrap().contains("<http://r/run-1|"));
        let f = body(WebhookFormat::Feishu, &n, &ev, "k1");
        assert_eq!(f["msg_type"], "post");
        let content = f["content"]["post"]["en_us"]["content"].as_array().unwrap();
        assert_eq!(content.last().unwrap()[0]["href"], "http://r/run-1");
    }

    #[test]
    fn the_signature_is_the_hmac_of_time_dot_body() {
        // Expected value from `printf '0.what do ya want for nothing?' | openssl dgst -sha256 -hmac Jefe`.
        let s = signature("Jefe", 0, b"what do ya want for nothing?");
        assert_eq!(s, "t=0,v1=37f471929915ccd2cbbe79feb84ffcff4f2bb25e15fc41c2506687331ae179cc");
        assert_ne!(signature("other", 0, b"x"), signature("Jefe", 0, b"x"));
        assert_ne!(signature("Jefe", 1, b"x"), signature("Jefe", 0, b"x"));
    }
}
