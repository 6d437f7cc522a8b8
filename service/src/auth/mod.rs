//! Authentication of the agent protocol: every task and every report is signed with an agent
//! key ([`keyring`]) in an [`envelope`], checked for freshness and replay here, and each run's
//! rendezvous secret travels to its nodes sealed under the node's key ([`rdzv`]).
//!
//! docs/security.md says what each key protects and how keys are provisioned and rotated.

pub mod envelope;
pub mod keyring;
pub mod rdzv;

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use gpusanity_common::wire::agent::{AgentCommand, AgentReport};
use gpusanity_common::wire::watch::Telemetry;
use gpusanity_common::wire::WIRE_VERSION;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use envelope::{AuthError, Direction};
pub use keyring::{KeyError, Keyring};

/// `[agent_auth]` of the service's configuration (the agent takes the same from its flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentAuthConfig {
    /// The agent key file (also GPUSANITY_AGENT_KEYS); required.
    pub keys_file: Option<PathBuf>,
    /// How old (or how far ahead, for clock skew) a message may be, in seconds.
    pub max_age_s: u64,
}

impl Default for AgentAuthConfig {
    fn default() -> Self {
        AgentAuthConfig { keys_file: None, max_age_s: 600 }
    }
}

impl AgentAuthConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(10..=86_400).contains(&self.max_age_s) {
            return Err("agent_auth.max_age_s must be between 10 and 86400".into());
        }
        Ok(())
    }

    /// The key file, required: without it anyone who can write to a topic could forge a verdict.
    pub fn keyring(&self) -> Result<Keyring, KeyError> {
        let path = self.keys_file.as_ref().ok_or_else(|| {
            KeyError::Bad(
                "no agent key file: set GPUSANITY_AGENT_KEYS (or agent_auth.keys_file); docs/security.md shows how to make one"
                    .into(),
            )
        })?;
        Keyring::load(path)
    }
}

/// The body of a signed message: it names the node it speaks for, and its wire version.
pub trait Addressed: DeserializeOwned {
    fn node(&self) -> &str;
    fn version(&self) -> u32;
}

macro_rules! addressed {
    ($($t:ty),*) => {$(
        impl Addressed for $t {
            fn node(&self) -> &str {
                &self.node
            }
            fn version(&self) -> u32 {
                self.version
            }
        }
    )*};
}
addressed!(AgentCommand, AgentReport, Telemetry);

/// Why [`Verifier::open_as`] refused a message.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Not signed, badly signed, stale or replayed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("malformed: {0}")]
    Malformed(serde_json::Error),
    /// Signed by a key that may not speak for the node the body names (the name is whole
    /// here, cut in the message).
    #[error("key `{key}` may not speak for node `{}`", .node.chars().take(64).collect::<String>())]
    WrongNode { key: String, node: String },
    #[error("of wire version {version} (this build reads {WIRE_VERSION})")]
    Version { node: String, version: u32 },
}

/// Nonces remembered at most (a bound on memory under a flood of valid messages).
const MAX_NONCES: usize = 1 << 20;

/// Opens envelopes: signature, freshness window, and nonces seen within the window.
pub struct Verifier {
    pub ring: Keyring,
    max_age: Duration,
    seen: HashSet<String>,
    order: VecDeque<(i64, String)>,
}

impl Verifier {
    pub fn new(ring: Keyring, max_age: Duration) -> Self {
        Verifier { ring, max_age, seen: HashSet::new(), order: VecDeque::new() }
    }

    /// The payload of an authentic, fresh, not yet seen message, and the key that signed it.
    pub fn open(&mut self, dir: Direction, bytes: &[u8]) -> Result<(String, keyring::Key), AuthError> {
        let now = chrono::Utc::now().timestamp_millis();
        let (env, key) = envelope::open(&self.ring, dir, bytes)?;
        let max_ms = i64::try_from(self.max_age.as_millis()).unwrap_or(i64::MAX);
        let age = now.saturating_sub(env.ts_ms);
        if age.checked_abs().is_none_or(|a| a > max_ms) {
            return Err(AuthError::Stale { age_s: age / 1000, max_s: self.max_age.as_secs() });
        }
        // Forget what left the window (or the oldest, past the bound).
        while let Some((ts, _)) = self.order.front() {
            if now.saturating_sub(*ts) <= max_ms && self.order.len() < MAX_NONCES {
                break;
            }
            if let Some((_, n)) = self.order.pop_front() {
                self.seen.remove(&n);
            }
        }
        if !self.seen.insert(env.nonce.clone()) {
            return Err(AuthError::Replayed);
        }
        self.order.push_back((env.ts_ms, env.nonce));
        Ok((env.payload, key.clone()))
    }

    /// [`Verifier::open`], then the body parsed, signed by a key that may speak for the node
    /// it names, and of this wire version. What else a body must be (its bounds, whether it is
    /// for this node) the caller checks.
    pub fn open_as<T: Addressed>(&mut self, dir: Direction, bytes: &[u8]) -> Result<(T, keyring::Key), Refused> {
        let (payload, key) = self.open(dir, bytes)?;
        let body: T = serde_json::from_str(&payload).map_err(Refused::Malformed)?;
        if !key.covers(body.node()) {
            return Err(Refused::WrongNode { key: key.id, node: body.node().to_string() });
        }
        if body.version() != WIRE_VERSION {
            return Err(Refused::Version { node: body.node().to_string(), version: body.version() });
        }
        Ok((body, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        let s = "ab".repeat(32);
        Keyring::parse(&format!(
            "[[key]]\nid = \"k1\"\nsecret = \"{s}\"\n[[key]]\nid = \"k2\"\nsecret = \"{}\"\nnodes = [\"n2\"]\n",
            "cd".repeat(32)
        ))
        .unwrap()
    }

    #[test]
    fn a_sealed_message_opens_once_in_its_direction_and_forgeries_do_not() {
        let r = ring();
        let mut v = Verifier::new(r.clone(), Duration::from_secs(60));
        let sealed = envelope::seal(r.first(), Direction::Report, "{\"x\":1}".into());
        let (payload, key) = v.open(Direction::Report, sealed.as_bytes()).unwrap();
        assert_eq!((payload.as_str(), key.id.as_str()), ("{\"x\":1}", "k1"));
        assert_eq!(v.open(Direction::Report, sealed.as_bytes()).unwrap_err(), AuthError::Replayed);
        let again = envelope::seal(r.first(), Direction::Report, "{\"x\":1}".into());
        assert!(matches!(v.open(Direction::Task, again.as_bytes()), Err(AuthError::BadMac(_))));
        let mut e: envelope::Envelope = serde_json::from_str(&again).unwrap();
        e.payload = "{\"x\":2}".into();
        let tampered = serde_json::to_vec(&e).unwrap();
        assert!(matches!(v.open(Direction::Report, &tampered), Err(AuthError::BadMac(_))));
        e.key_id = "nope".into();
        assert!(matches!(v.open(Direction::Report, &serde_json::to_vec(&e).unwrap()), Err(AuthError::UnknownKey(_))));
        assert!(matches!(v.open(Direction::Report, b"{\"version\":1}"), Err(AuthError::NotSigned(_))));
        // A key from another ring with the same id does not verify.
        let other = Keyring::parse(&format!("[[key]]\nid = \"k1\"\nsecret = \"{}\"\n", "ef".repeat(32))).unwrap();
        let forged = envelope::seal(other.first(), Direction::Report, "{}".into());
        assert!(matches!(v.open(Direction::Report, forged.as_bytes()), Err(AuthError::BadMac(_))));
    }

    #[test]
    fn a_body_opens_only_if_its_key_speaks_for_its_node_and_its_version_is_this_builds() {
        let r = ring();
        let k2 = r.get("k2").unwrap();
        let mut v = Verifier::new(r.clone(), Duration::from_secs(60));
        let command = |node: &str, version: u32| {
            let c = AgentCommand {
                version,
                node: node.into(),
                body: gpusanity_common::wire::agent::CommandBody::Unwatch { job_id: "j".into(), run_id: "r".into() },
            };
            serde_json::to_string(&c).unwrap()
        };
        let open = |v: &mut Verifier, key: &keyring::Key, payload: String| {
            v.open_as::<AgentCommand>(Direction::Task, envelope::seal(key, Direction::Task, payload).as_bytes())
        };
        let (c, key) = open(&mut v, k2, command("n2", WIRE_VERSION)).unwrap();
        assert_eq!((c.node.as_str(), key.id.as_str()), ("n2", "k2"));
        // k2 speaks for n2 alone; the refusal keeps the whole name and cuts it in its message.
        let long = "n".repeat(300);
        match open(&mut v, k2, command(&long, WIRE_VERSION)) {
            Err(e @ Refused::WrongNode { .. }) => {
                assert!(e.to_string().len() < 120, "{e}");
                assert!(matches!(e, Refused::WrongNode { node, .. } if node == long));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            open(&mut v, r.first(), command("n9", WIRE_VERSION + 1)),
            Err(Refused::Version { node, .. }) if node == "n9"
        ));
        assert!(matches!(open(&mut v, r.first(), "{\"node\":\"n2\"}".into()), Err(Refused::Malformed(_))));
        assert!(matches!(
            v.open_as::<AgentCommand>(Direction::Task, command("n2", WIRE_VERSION).as_bytes()),
            Err(Refused::Auth(AuthError::NotSigned(_)))
        ));
    }

    #[test]
    fn messages_outside_the_window_are_stale() {
        let r = ring();
        let mut v = Verifier::new(r.clone(), Duration::from_secs(10));
        let now = chrono::Utc::now().timestamp_millis();
        for ts in [now - 60_000, now + 60_000, i64::MIN, i64::MAX] {
            let m = envelope::seal_at(r.first(), Direction::Task, "{}".into(), ts);
            assert!(matches!(v.open(Direction::Task, m.as_bytes()), Err(AuthError::Stale { .. })), "{ts}");
        }
        let m = envelope::seal_at(r.first(), Direction::Task, "{}".into(), now - 5_000);
        assert!(v.open(Direction::Task, m.as_bytes()).is_ok());
    }
}
