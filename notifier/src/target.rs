//! Where one delivery goes: a webhook, or one recipient of an email channel, as a rule's
//! channel names it; stored with the delivery as JSON, read back by the sender and the API.

use serde::{Deserialize, Serialize};

use crate::rules::{Channel, WebhookFormat};

/// Where one delivery goes; stored with the delivery as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Target {
    Webhook {
        url: String,
        format: WebhookFormat,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
    },
    Email {
        to: String,
    },
}

impl Target {
    pub fn channel(&self) -> &'static str {
        match self {
            Target::Webhook { .. } => "webhook",
            Target::Email { .. } => "email",
        }
    }

    pub fn address(&self) -> &str {
        match self {
            Target::Webhook { url, .. } => url,
            Target::Email { to } => to,
        }
    }

    pub fn from_json(channel: &str, json: &str) -> Option<Target> {
        serde_json::from_str::<Target>(json).ok().filter(|t| t.channel() == channel)
    }
}

/// The targets of one channel: a webhook, or each recipient of an email channel.
pub fn targets(c: &Channel) -> Vec<Target> {
    match c {
        Channel::Webhook { url, format, secret } => {
            vec![Target::Webhook { url: url.clone(), format: *format, secret: secret.clone() }]
        }
        Channel::Email { to } => to.iter().map(|a| Target::Email { to: a.clone() }).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_through_json() {
        let w = Target::Webhook { url: "http://h/".into(), format: WebhookFormat::Slack, secret: Some("s".into()) };
        let e = Target::Email { to: "a@b.c".into() };
        for t in [w, e] {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(Target::from_json(t.channel(), &json), Some(t.clone()));
        }
        assert_eq!(Target::from_json("email", r#"{"url":"http://h/","format":"generic"}"#), None);
    }
}
