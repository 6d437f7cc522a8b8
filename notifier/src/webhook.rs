//! The webhook channel: the body in the receiver's format, the `Idempotency-Key` header, an
//! HMAC-SHA256 signature header when the channel has a secret, and the POST itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpusanity_common::wire::output::OutputEvent;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::escape;
use crate::guard::{self, Policy};
use crate::notice::Notice;
use crate::rules::WebhookFormat;

/// The signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub const SIGNATURE_HEADER: &str = "X-Gpusanity-Signature";
pub const EVENT_HEADER: &str = "X-Gpusanity-Event";

/// The request body for `format`.
pub fn body(format: WebhookFormat, n: &Notice, ev: &OutputEvent, key: &str) -> Value {
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
        // Markdown: every value from outside escaped, the report's address (the operator's) as
        // the one link.
        WebhookFormat::Dingtalk => {
            let lines = n.text_lines_with(&escape::markdown, false);
            let mut text = format!("### {}\n\n", n.title_with(&escape::markdown));
            text.push_str(&lines.iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n"));
            if let Some(u) = &n.report_url {
                text.push_str(&format!("\n\n[Open the report]({u})"));
            }
            json!({ "msgtype": "markdown", "markdown": { "title": n.title_with(&escape::plain), "text": text } })
        }
        WebhookFormat::Slack => {
            let mut lines = n.text_lines_with(&escape::slack, false);
            let link = n.report_url.as_deref().map(escape::slack_entities);
            if let Some(l) = &link {
                lines.push(format!("Report: {l}"));
            }
            let title = n.title_with(&escape::slack);
            let detail = lines.join("\n");
            let mut blocks = vec![
                json!({ "type": "header", "text": { "type": "plain_text", "text": n.title_with(&escape::plain) } }),
                json!({ "type": "section", "text": { "type": "mrkdwn", "text": detail } }),
            ];
            if let Some(link) = &link {
                blocks.push(json!({ "type": "section", "text": { "type": "mrkdwn", "text": format!("<{link}|Open the report>") } }));
            }
            json!({ "text": format!("{title}\n{detail}"), "blocks": blocks })
        }
        // Always a rich-text post: its `text` elements are shown as written, where a text
        // message would parse `<at user_id="all">` in a job name as a mention of everyone.
        WebhookFormat::Feishu => {
            let lines = n.text_lines_with(&escape::plain, false);
            let mut content: Vec<Value> = lines.iter().map(|l| json!([{ "tag": "text", "text": l }])).collect();
            if let Some(u) = &n.report_url {
                content.push(json!([{ "tag": "a", "text": "Open the report", "href": u }]));
            }
            let title = n.title_with(&escape::plain);
            json!({ "msg_type": "post", "content": { "post": { "en_us": { "title": title, "content": content } } } })
        }
    }
}

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(msg);
    mac.finalize().into_bytes().to_vec()
}

/// The robots' own signing, for DingTalk and Feishu robots with "signature" security on (they
/// reject unsigned requests): DingTalk wants `timestamp` (ms) and `sign` = base64(HMAC-SHA256
/// keyed with the secret, of "<timestamp>\n<secret>") in the URL's query; Feishu wants
/// `timestamp` (s) and `sign` = base64(HMAC-SHA256 keyed with "<timestamp>\n<secret>", of
/// nothing) in the body. Other formats, or no secret: unchanged.
pub fn platform_signed(
    format: WebhookFormat,
    url: &str,
    secret: Option<&str>,
    mut body: Value,
    now_ms: i64,
) -> (String, Value) {
    use base64::Engine;
    let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
    match (format, secret) {
        (WebhookFormat::Dingtalk, Some(s)) => {
            let t = now_ms.to_string();
            let sign = b64(hmac_sha256(s.as_bytes(), format!("{t}\n{s}").as_bytes()));
            match reqwest::Url::parse(url) {
                Ok(mut u) => {
                    u.query_pairs_mut().append_pair("timestamp", &t).append_pair("sign", &sign);
                    (u.to_string(), body)
                }
                // Validated when the rule was stored; left as it is, the request fails and says why.
                Err(_) => (url.to_string(), body),
            }
        }
        (WebhookFormat::Feishu, Some(s)) => {
            let t = (now_ms / 1000).to_string();
            body["sign"] = json!(b64(hmac_sha256(format!("{t}\n{s}").as_bytes(), b"")));
            body["timestamp"] = json!(t);
            (url.to_string(), body)
        }
        _ => (url.to_string(), body),
    }
}

/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed with the secret>`.
pub fn signature(secret: &str, t: u64, body: &[u8]) -> String {
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(body);
    format!("t={t},v1={}", hex::encode(hmac_sha256(secret.as_bytes(), &msg)))
}

/// How a POST ended. The messages are fixed classifications (`HTTP 500`, `connection
/// refused`, `blocked: loopback address ...`): nothing of the target's answer is kept, so the
/// delivery log cannot be used to read what an internal address answers.
pub enum Sent {
    Ok(u16),
    /// Worth another try: a network error, a timeout, 408, 429 or 5xx.
    Retry(Option<u16>, String),
    /// Another try would fail the same way (other 4xx, redirects, a refused address).
    GiveUp(Option<u16>, String),
}

#[allow(clippy::too_many_arguments)]
pub async fn post(
    client: &reqwest::Client,
    policy: &Policy,
    url: &str,
    secret: Option<&str>,
    key: &str,
    event_type: &str,
    body: &Value,
    timeout: Duration,
) -> Sent {
    if let Err(b) = policy.check_url(url) {
        return Sent::GiveUp(None, b.to_string());
    }
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
            // The answer's body is dropped unread: only its status is kept.
            let why = match code {
                300..=399 => format!("HTTP {code} (redirects are not followed)"),
                _ => format!("HTTP {code}"),
            };
            if code == 408 || code == 429 || code >= 500 {
                Sent::Retry(Some(code), why)
            } else {
                Sent::GiveUp(Some(code), why)
            }
        }
        Err(e) => match guard::blocked_in(&e) {
            Some(b) => Sent::GiveUp(None, b.to_string()),
            // A layer between the resolver and here that kept only the message.
            None => match error_chain(&e).split_once("blocked: ") {
                Some((_, rest)) => {
                    let class = rest.split(" (").next().unwrap_or("address");
                    Sent::GiveUp(None, format!("blocked: {class} (not in notifier.webhook_allow)"))
                }
                None => Sent::Retry(None, failure(&e, timeout)),
            },
        },
    }
}

/// A fixed description of a request that got no answer.
pub fn failure(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {:.1} s", timeout.as_secs_f64());
    }
    let chain = error_chain(e).to_ascii_lowercase();
    let io_kind = {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut kind = None;
        while let Some(c) = cur {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                kind = Some(io.kind());
            }
            cur = c.source();
        }
        kind
    };
    match io_kind {
        Some(std::io::ErrorKind::ConnectionRefused) => "connection refused".into(),
        Some(std::io::ErrorKind::ConnectionReset) => "connection reset".into(),
        _ if chain.contains("dns error") || chain.contains("failed to lookup") => "DNS lookup failed".into(),
        _ if chain.contains("certificate") || chain.contains("tls") => "TLS handshake failed".into(),
        _ if e.is_connect() => "connect failed".into(),
        _ if e.is_body() || e.is_decode() => "the answer was cut off".into(),
        _ => "request failed".into(),
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
                backend: None,
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
    fn names_from_outside_stay_text_in_chat_messages() {
        let mut ev = event();
        ev.job_id = "[x](http://evil.example)".into();
        ev.body = OutputBody::CheckFailed {
            summary: "rank 1: **slow**\n# <at user_id=\"all\"></at> see www.evil.example".into(),
            faulty_nodes: vec!["n_1".into()],
            report_url: "http://r/run-1?a=1&b=2".into(),
            reason: FailReason::CheckFailed,
            backend: None,
        };
        let n = Notice::from_event(&ev, "http://x/{run_id}");
        let d = body(WebhookFormat::Dingtalk, &n, &ev, "k1");
        let text = d["markdown"]["text"].as_str().unwrap();
        let z = '\u{200b}';
        assert_eq!(
            text,
            format!(
                "### gpusanity: job \\[x\\]\\(http:{z}//evil\\.example\\) failed the check (workspace ws)\n\n\
                 - Verdict: failed\n- Faulty nodes: n\\_1\n\
                 - Summary: rank 1: \\*\\*slow\\*\\* \\# \\<at user\\_id=\\\"all\\\"\\>\\</at\\> see www{z}\\.evil\\.example\n\
                 - Job: \\[x\\]\\(http:{z}//evil\\.example\\) (workspace ws)\n- Run: run\\-1\n- At: {}\n\n\
                 [Open the report](http://r/run-1?a=1&b=2)",
                n.at
            )
        );
        assert_eq!(text.matches("](").count(), 1, "one link, the report's: {text}");
        assert!(!d["markdown"]["title"].as_str().unwrap().contains("http://"), "{d}");
        let f = body(WebhookFormat::Feishu, &n, &ev, "k1");
        assert_eq!(f["msg_type"], "post", "never a text message, which parses <at>");
        let post = &f["content"]["post"]["en_us"];
        assert_eq!(
            post["title"],
            format!("gpusanity: job [x](http:{z}//evil.example) failed the check (workspace ws)")
        );
        assert_eq!(
            post["content"][2][0]["text"],
            format!("Summary: rank 1: **slow** # <at user_id=\"all\"></at> see www{z}.evil.example")
        );
        assert!(post["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l[0]["tag"] == "text" || l[0]["href"] == "http://r/run-1?a=1&b=2"));
        let s = body(WebhookFormat::Slack, &n, &ev, "k1");
        let detail = s["blocks"][1]["text"]["text"].as_str().unwrap();
        assert!(
            detail.contains("&lt;at user_id=\"all\"&gt;") && detail.contains("Report: http://r/run-1?a=1&amp;b=2"),
            "{detail}"
        );
    }

    #[test]
    fn dingtalk_and_feishu_robots_get_their_own_signatures() {
        // Expected values from Python: base64(hmac.new(key, msg, sha256).digest()).
        let (url, body) = platform_signed(
            WebhookFormat::Dingtalk,
            "https://oapi.example/robot/send?access_token=T",
            Some("SEC"),
            json!({}),
            1_700_000_000_000,
        );
        let u = reqwest::Url::parse(&url).unwrap();
        let q: std::collections::HashMap<_, _> = u.query_pairs().into_owned().collect();
        assert_eq!(q["access_token"], "T");
        assert_eq!(q["timestamp"], "1700000000000");
        assert_eq!(q["sign"], "r+2we0q01lkZqz38LA5IPNbHN81U1leRf3Au4PSQb6Q=");
        assert_eq!(body, json!({}));
        let (url, body) = platform_signed(
            WebhookFormat::Feishu,
            "https://open.example/hook/x",
            Some("SEC"),
            json!({"msg_type": "text"}),
            1_700_000_000_999,
        );
        assert_eq!(url, "https://open.example/hook/x");
        assert_eq!(
            body,
            json!({"msg_type": "text", "timestamp": "1700000000", "sign": "yKzlnG5gJbbUvULgjP0QN/V99n1fNH31XG8Rrvl9pfk="})
        );
        let (url, body) = platform_signed(WebhookFormat::Slack, "https://h/x", Some("SEC"), json!({}), 1);
        assert_eq!((url.as_str(), body), ("https://h/x", json!({})));
        assert_eq!(platform_signed(WebhookFormat::Dingtalk, "https://h/x", None, json!({}), 1).0, "https://h/x");
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
