//! The email channel: a multipart message (plain text and HTML, the HTML rendered by askama
//! from templates/email_check.html with every value escaped) sent over SMTP by lettre, with
//! STARTTLS off, opportunistic or required, and a Message-ID derived from the idempotency key.

use std::time::Duration;

use askama::Template;
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::{SmtpConfig, StartTls};
use crate::notice::Notice;
use crate::NotifyError;

#[derive(Template)]
#[template(path = "email_check.html")]
struct EmailPage<'a> {
    n: &'a Notice,
    title: String,
}

/// A configured SMTP sender.
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The domain part of Message-IDs.
    domain: String,
}

/// How one email ended.
pub enum Mailed {
    Ok,
    Retry(String),
    GiveUp(String),
}

impl Mailer {
    /// None when no SMTP host is configured.
    pub fn new(c: &SmtpConfig, timeout: Duration) -> Result<Option<Mailer>, NotifyError> {
        if c.host.is_empty() {
            return Ok(None);
        }
        let bad = |e: String| NotifyError::Config(format!("notifier.smtp: {e}"));
        let from: Mailbox = c.from.parse().map_err(|e| bad(format!("from `{}`: {e}", c.from)))?;
        let mut params = TlsParameters::builder(c.host.clone());
        if let Some(path) = &c.ca_file {
            let pem = std::fs::read(path).map_err(|e| bad(format!("ca_file {}: {e}", path.display())))?;
            let cert = Certificate::from_pem(&pem).map_err(|e| bad(format!("ca_file {}: {e}", path.display())))?;
            params = params.add_root_certificate(cert);
        }
        let params = params.build_rustls().map_err(|e| bad(format!("TLS: {e}")))?;
        let tls = match c.starttls {
            StartTls::Off => Tls::None,
            StartTls::Opportunistic => Tls::Opportunistic(params),
            StartTls::Required => Tls::Required(params),
        };
        let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(c.host.as_str())
            .port(c.port)
            .tls(tls)
            .timeout(Some(timeout));
        let password = std::env::var("GPUSANITY_SMTP_PASSWORD").ok().or_else(|| c.password.clone());
        if let (Some(u), Some(p)) = (&c.username, password) {
            b = b.credentials(Credentials::new(u.clone(), p));
        }
        let domain = from.email.domain().to_string();
        Ok(Some(Mailer { transport: b.build(), from, domain }))
    }

    pub async fn send(&self, n: &Notice, to: &str, key: &str) -> Mailed {
        let msg = match message(n, &self.from, to, &format!("<{key}@{}>", self.domain)) {
            Ok(m) => m,
            Err(e) => return Mailed::GiveUp(e.to_string()),
        };
        match self.transport.send(msg).await {
            Ok(_) => Mailed::Ok,
            // A permanent SMTP answer (5xx: no such mailbox, rejected) will not change on a retry.
            Err(e) if e.is_permanent() => Mailed::GiveUp(crate::webhook::error_chain(&e)),
            Err(e) => Mailed::Retry(crate::webhook::error_chain(&e)),
        }
    }
}

/// The message: From, To, Subject, a stable Message-ID and both bodies.
pub fn message(n: &Notice, from: &Mailbox, to: &str, message_id: &str) -> Result<Message, NotifyError> {
    let to: Mailbox = to.parse().map_err(|e| NotifyError::Message(format!("recipient `{to}`: {e}")))?;
    let title = n.title();
    let html = EmailPage { n, title: title.clone() }
        .render()
        .map_err(|e| NotifyError::Message(format!("rendering the HTML body: {e}")))?;
    let text = format!("{title}\n\n{}\n", n.text_lines().join("\n"));
    Message::builder()
        .from(from.clone())
        .to(to)
        .subject(title)
        .message_id(Some(message_id.to_string()))
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| NotifyError::Message(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::wire::output::{FailReason, OutputBody, OutputEvent};

    #[test]
    fn both_bodies_carry_the_verdict_and_the_html_escapes_the_job() {
        let ev = OutputEvent {
            version: 1,
            event_id: "o1".into(),
            job_id: "<script>alert('x')</script>".into(),
            workspace_id: "ws".into(),
            run_id: Some("r1".into()),
            cause_event_id: "i1".into(),
            at: chrono::Utc::now(),
            body: OutputBody::CheckFailed {
                summary: "slow".into(),
                faulty_nodes: vec!["n9".into()],
                report_url: "http://r/r1".into(),
                reason: FailReason::CheckFailed,
                backend: None,
            },
        };
        let n = Notice::from_event(&ev, "");
        let from: Mailbox = "gpusanity <g@example.org>".parse().unwrap();
        let m = message(&n, &from, "ops@example.org", "<k@example.org>").unwrap();
        let raw = String::from_utf8(m.formatted()).unwrap();
        assert!(raw.contains("Message-ID: <k@example.org>"), "{raw}");
        assert!(raw.contains("multipart/alternative"));
        let html = EmailPage { n: &n, title: n.title() }.render().unwrap();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&#60;script&#62;") || html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("n9") && html.contains("failed") && html.contains("http://r/r1"));
        assert!(message(&n, &from, "not an address", "<k@x>").is_err());
    }
}
