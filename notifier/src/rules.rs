//! Notification rules: which output events of a workspace go to which channels, and the
//! validation of a rule as the API receives it.

use gpusanity_common::wire::output::{FailReason, OutputBody};
use serde::{Deserialize, Serialize};

/// The event types a rule can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// Every CheckFailed (a timed-out one too).
    CheckFailed,
    CheckPassed,
    /// Only the CheckFailed events whose reason is `timed_out`.
    CheckTimedOut,
    NodeIsolated,
    /// A node suspected while its job runs (docs/watch.md).
    NodeSuspected,
}

impl EventKind {
    /// Whether an output event is of this kind.
    pub fn matches(self, body: &OutputBody) -> bool {
        match (self, body) {
            (EventKind::CheckFailed, OutputBody::CheckFailed { .. }) => true,
            (EventKind::CheckTimedOut, OutputBody::CheckFailed { reason, .. }) => *reason == FailReason::TimedOut,
            (EventKind::CheckPassed, OutputBody::CheckPassed { .. }) => true,
            (EventKind::NodeIsolated, OutputBody::NodeIsolated { .. }) => true,
            (EventKind::NodeSuspected, OutputBody::NodeSuspected { .. }) => true,
            _ => false,
        }
    }
}

/// The message layout a webhook receiver expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    #[default]
    Generic,
    Dingtalk,
    Slack,
    Feishu,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Channel {
    Webhook {
        url: String,
        #[serde(default)]
        format: WebhookFormat,
        /// Signs each request (HMAC-SHA256) when set; never returned by the API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
    },
    Email {
        to: Vec<String>,
    },
}

/// A rule as the API receives it (POST and PUT).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleInput {
    pub name: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_events")]
    pub events: Vec<EventKind>,
    pub channels: Vec<Channel>,
}

fn yes() -> bool {
    true
}

fn default_events() -> Vec<EventKind> {
    vec![EventKind::CheckFailed]
}

/// A stored rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    pub rule_id: String,
    pub workspace_id: String,
    pub name: String,
    pub enabled: bool,
    pub events: Vec<EventKind>,
    pub channels: Vec<Channel>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl Rule {
    pub fn wants(&self, body: &OutputBody) -> bool {
        self.enabled && self.events.iter().any(|k| k.matches(body))
    }

    /// The rule as the API shows it: secrets left out, `secret_set` in their place.
    pub fn public(&self) -> serde_json::Value {
        let channels: Vec<serde_json::Value> = self
            .channels
            .iter()
            .map(|c| match c {
                Channel::Webhook { url, format, secret } => {
                    serde_json::json!({ "type": "webhook", "url": url, "format": format, "secret_set": secret.is_some() })
                }
                Channel::Email { to } => serde_json::json!({ "type": "email", "to": to }),
            })
            .collect();
        serde_json::json!({
            "rule_id": self.rule_id, "workspace_id": self.workspace_id, "name": self.name, "enabled": self.enabled,
            "events": self.events, "channels": channels, "created_at_ms": self.created_at_ms, "updated_at_ms": self.updated_at_ms,
        })
    }
}

impl RuleInput {
    /// Refuses a webhook URL whose host is a literal address that `policy`
    /// does not allow; names are checked when a delivery connects.
    pub fn check_targets(&self, policy: &crate::guard::Policy) -> Result<(), String> {
        for (i, c) in self.channels.iter().enumerate() {
            if let Channel::Webhook { url, .. } = c {
                policy.check_url(url).map_err(|b| format!("channels[{i}].url `{url}`: {b}"))?;
            }
        }
        Ok(())
    }

    /// Checks what serde cannot: names, URLs, addresses, non-empty lists.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return Err("`name` must be 1 to 200 characters".into());
        }
        if let Some((at, c)) = self.name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(match c {
                '\0' => format!("`name` holds a NUL character (byte {at})"),
                c => format!("`name` holds the control character U+{:04X} (byte {at})", u32::from(c)),
            });
        }
        if self.events.is_empty() {
            return Err(
                "`events` is empty: name at least one of CheckFailed, CheckPassed, CheckTimedOut, NodeIsolated, NodeSuspected".into(),
            );
        }
        if self.channels.is_empty() {
            return Err("`channels` is empty: give at least one webhook or email channel".into());
        }
        for (i, c) in self.channels.iter().enumerate() {
            match c {
                Channel::Webhook { url, secret, .. } => {
                    let u = reqwest::Url::parse(url).map_err(|e| format!("channels[{i}].url `{url}`: {e}"))?;
                    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                        return Err(format!(
                            "channels[{i}].url `{url}`: expected an http:// or https:// URL with a host"
                        ));
                    }
                    if secret.as_deref().is_some_and(str::is_empty) {
                        return Err(format!("channels[{i}].secret is empty: leave it out for unsigned requests"));
                    }
                    if secret.as_deref().is_some_and(|s| s.contains('\0') || s.len() > 1024) {
                        return Err(format!("channels[{i}].secret holds a NUL character or is over 1024 bytes"));
                    }
                }
                Channel::Email { to } => {
                    if to.is_empty() {
                        return Err(format!("channels[{i}].to is empty"));
                    }
                    for a in to {
                        a.parse::<lettre::Address>().map_err(|e| format!("channels[{i}].to `{a}`: {e}"))?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(json: &str) -> Result<RuleInput, String> {
        let r: RuleInput = serde_json::from_str(json).map_err(|e| e.to_string())?;
        r.validate().map(|_| r)
    }

    #[test]
    fn defaults_and_validation() {
        let r = input(r#"{"name":"n","channels":[{"type":"webhook","url":"https://h.example/x"}]}"#).unwrap();
        assert!(r.enabled);
        assert_eq!(r.events, [EventKind::CheckFailed]);
        assert_eq!(
            r.channels[0],
            Channel::Webhook { url: "https://h.example/x".into(), format: WebhookFormat::Generic, secret: None }
        );
        assert!(input(r#"{"name":"n","channels":[]}"#).unwrap_err().contains("channels"));
        let hook = r#""channels":[{"type":"webhook","url":"https://h.example/x"}]"#;
        let nul = input(&format!(r#"{{"name":"a\u0000b",{hook}}}"#)).unwrap_err();
        assert_eq!(nul, "`name` holds a NUL character (byte 1)");
        assert!(input(&format!(r#"{{"name":"a\nb",{hook}}}"#)).unwrap_err().contains("control character"));
        assert!(input(r#"{"name":"n","channels":[{"type":"webhook","url":"not a url"}]}"#)
            .unwrap_err()
            .contains("url"));
        assert!(input(r#"{"name":"n","channels":[{"type":"webhook","url":"ftp://h/x"}]}"#)
            .unwrap_err()
            .contains("http"));
        assert!(input(r#"{"name":"n","channels":[{"type":"webhook","url":"http://h/","format":"teams"}]}"#)
            .unwrap_err()
            .contains("teams"));
        assert!(input(r#"{"name":"n","channels":[{"type":"email","to":["nobody"]}]}"#).unwrap_err().contains("nobody"));
        assert!(input(r#"{"name":"n","channels":[{"type":"email","to":[]}]}"#).is_err());
        assert!(input(r#"{"name":"","channels":[{"type":"email","to":["a@b.c"]}]}"#).is_err());
        assert!(input(r#"{"name":"n","events":["Checking"],"channels":[{"type":"email","to":["a@b.c"]}]}"#).is_err());
    }

    #[test]
    fn a_timeout_rule_takes_only_timed_out_failures() {
        let failed = |reason| OutputBody::CheckFailed {
            summary: String::new(),
            faulty_nodes: vec![],
            report_url: String::new(),
            reason,
            backend: None,
        };
        assert!(EventKind::CheckTimedOut.matches(&failed(FailReason::TimedOut)));
        assert!(!EventKind::CheckTimedOut.matches(&failed(FailReason::CheckFailed)));
        assert!(EventKind::CheckFailed.matches(&failed(FailReason::TimedOut)));
        assert!(!EventKind::CheckPassed.matches(&failed(FailReason::CheckFailed)));
        let skipped = OutputBody::CheckSkipped { reason: String::new() };
        assert!(![EventKind::CheckFailed, EventKind::CheckPassed, EventKind::CheckTimedOut, EventKind::NodeIsolated]
            .iter()
            .any(|k| k.matches(&skipped)));
    }
}
