//! The `[notifier]` section of the service's configuration (docs/service.md).

use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::guard::Policy;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifierConfig {
    /// Off: nothing is planned or sent (the outbox rows wait, unplanned, until it is on again).
    pub enabled: bool,
    /// How often the planner looks for new output events when idle.
    pub poll_ms: u64,
    /// Attempts per delivery before it is marked failed.
    pub max_attempts: u32,
    /// Backoff before retry n (1-based): `backoff_base_s * 2^(n-1)`, at most `backoff_max_s`,
    /// then a random jitter of up to a quarter of it either way.
    pub backoff_base_s: f64,
    pub backoff_max_s: f64,
    /// Limit of one webhook request (connect, send, answer).
    pub webhook_timeout_s: f64,
    /// Limit of one email (connect, TLS, SMTP dialogue).
    pub email_timeout_s: f64,
    /// Deliveries in flight at once.
    pub concurrency: usize,
    /// Networks webhooks may reach although they are loopback, private, link-local, CGNAT or
    /// the metadata address (refused by default), as CIDR, e.g. `["10.0.0.0/8"]`.
    pub webhook_allow: Vec<IpNet>,
    pub smtp: SmtpConfig,
}

impl Default for NotifierConfig {
    fn default() -> Self {
        NotifierConfig {
            enabled: true,
            poll_ms: 200,
            max_attempts: 8,
            backoff_base_s: 2.0,
            backoff_max_s: 300.0,
            webhook_timeout_s: 10.0,
            email_timeout_s: 30.0,
            concurrency: 32,
            webhook_allow: Vec::new(),
            smtp: SmtpConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StartTls {
    /// Plain SMTP (a relay on a trusted network only).
    Off,
    /// STARTTLS when the server offers it, plain otherwise.
    Opportunistic,
    /// STARTTLS or no mail.
    #[default]
    Required,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// Empty: no email channel (email deliveries fail at once, saying so).
    pub host: String,
    pub port: u16,
    pub starttls: StartTls,
    pub username: Option<String>,
    /// Better from GPUSANITY_SMTP_PASSWORD than from the file.
    pub password: Option<String>,
    /// The sender, `gpusanity <gpusanity@example.com>`.
    pub from: String,
    /// A PEM file of extra trusted certificates (a private CA, a self-signed server).
    pub ca_file: Option<PathBuf>,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            host: String::new(),
            port: 587,
            starttls: StartTls::Required,
            username: None,
            password: None,
            from: String::new(),
            ca_file: None,
        }
    }
}

impl NotifierConfig {
    /// Where webhooks may go.
    pub fn policy(&self) -> Policy {
        Policy::new(self.webhook_allow.clone())
    }

    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("backoff_base_s", self.backoff_base_s),
            ("backoff_max_s", self.backoff_max_s),
            ("webhook_timeout_s", self.webhook_timeout_s),
            ("email_timeout_s", self.email_timeout_s),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("notifier.{name} must be a positive number of seconds, not {v}"));
            }
        }
        if self.max_attempts == 0 || self.concurrency == 0 || self.poll_ms == 0 {
            return Err("notifier.max_attempts, notifier.concurrency and notifier.poll_ms must be at least 1".into());
        }
        if !self.smtp.host.is_empty() {
            self.smtp
                .from
                .parse::<lettre::message::Mailbox>()
                .map_err(|e| format!("notifier.smtp.from `{}`: {e}", self.smtp.from))?;
            if self.smtp.username.is_some() != self.smtp.password.is_some() {
                return Err("notifier.smtp: give both username and password, or neither".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_do_not() {
        assert!(NotifierConfig::default().validate().is_ok());
        let c: NotifierConfig = toml::from_str(
            "max_attempts = 3\n[smtp]\nhost = \"mx\"\nfrom = \"g <g@x.org>\"\nstarttls = \"opportunistic\"\n",
        )
        .unwrap();
        assert_eq!(c.smtp.starttls, StartTls::Opportunistic);
        let a: NotifierConfig =
            toml::from_str("webhook_allow = [\"127.0.0.1/32\", \"10.0.0.0/8\", \"::1/128\"]\n").unwrap();
        assert_eq!(a.webhook_allow.len(), 3);
        assert!(toml::from_str::<NotifierConfig>("webhook_allow = [\"10.0.0.0/33\"]\n").is_err());
        assert!(c.validate().is_ok());
        assert!(toml::from_str::<NotifierConfig>("[smtp]\nstarttls = \"maybe\"\n").is_err());
        let mut bad = c.clone();
        bad.smtp.from = "not an address".into();
        assert!(bad.validate().is_err());
        bad = c.clone();
        bad.backoff_base_s = 0.0;
        assert!(bad.validate().is_err());
        bad = c;
        bad.smtp.username = Some("u".into());
        assert!(bad.validate().is_err());
    }
}
