//! The signed envelope every agent-protocol message travels in.
//!
//! ```json
//! {"auth":1,"key_id":"2026-12","ts_ms":1764590000000,"nonce":"32 hex digits",
//!  "payload":"{\"version\":1,\"node\":\"gpu-017\",...}","mac":"64 hex digits"}
//! ```
//!
//! `mac` is HMAC-SHA256 under the key `key_id` over the direction (task or report), the key id,
//! the time, the nonce and the payload's bytes, each followed by a NUL. The payload is carried
//! as a string, so the bytes verified are the bytes parsed (no canonical JSON is needed), and
//! the direction in the MAC keeps a report from being replayed as a task. Freshness is checked
//! by [`super::Verifier`].

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use thiserror::Error;

use super::keyring::{Key, Keyring};

/// Version of the envelope.
pub const AUTH_VERSION: u32 = 1;

/// Largest envelope read: a result carries node 0's report (the producer allows 8 MB).
pub const MAX_ENVELOPE: usize = 8_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Service to agent.
    Task,
    /// Agent to service.
    Report,
    /// Agent to service, on the telemetry topic (docs/watch.md).
    Telemetry,
}

impl Direction {
    fn label(self) -> &'static [u8] {
        match self {
            Direction::Task => b"gpusanity-agent-task",
            Direction::Report => b"gpusanity-agent-report",
            Direction::Telemetry => b"gpusanity-agent-telemetry",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub auth: u32,
    pub key_id: String,
    pub ts_ms: i64,
    pub nonce: String,
    pub payload: String,
    pub mac: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AuthError {
    #[error("message of {0} bytes, over the {MAX_ENVELOPE}-byte limit")]
    TooLarge(usize),
    #[error("not a signed message: {0}")]
    NotSigned(String),
    #[error("envelope version {0} (this build reads {AUTH_VERSION})")]
    Version(u32),
    #[error("signed with unknown key `{0}`")]
    UnknownKey(String),
    #[error("bad signature (key `{0}`)")]
    BadMac(String),
    #[error("message stamped {age_s} s from now, outside the {max_s} s window")]
    Stale { age_s: i64, max_s: u64 },
    #[error("replayed message (nonce seen before)")]
    Replayed,
}

fn mac_of(key: &Key, dir: Direction, key_id: &str, ts_ms: i64, nonce: &str, payload: &str) -> Hmac<Sha256> {
    key.mac(&[dir.label(), key_id.as_bytes(), ts_ms.to_string().as_bytes(), nonce.as_bytes(), payload.as_bytes()])
}

/// Wraps `payload` in an envelope signed with `key`, stamped now.
pub fn seal(key: &Key, dir: Direction, payload: String) -> String {
    seal_at(key, dir, payload, chrono::Utc::now().timestamp_millis())
}

/// [`seal`] stamped at `ts_ms` (milliseconds since the epoch).
pub fn seal_at(key: &Key, dir: Direction, payload: String, ts_ms: i64) -> String {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let mac = hex::encode(mac_of(key, dir, &key.id, ts_ms, &nonce, &payload).finalize().into_bytes());
    let e = Envelope { auth: AUTH_VERSION, key_id: key.id.clone(), ts_ms, nonce, payload, mac };
    serde_json::to_string(&e).unwrap_or_default()
}

/// Checks the envelope's signature (not its freshness) and returns it with the key.
pub fn open<'k>(ring: &'k Keyring, dir: Direction, bytes: &[u8]) -> Result<(Envelope, &'k Key), AuthError> {
    if bytes.len() > MAX_ENVELOPE {
        return Err(AuthError::TooLarge(bytes.len()));
    }
    let e: Envelope = serde_json::from_slice(bytes).map_err(|err| AuthError::NotSigned(err.to_string()))?;
    if e.auth != AUTH_VERSION {
        return Err(AuthError::Version(e.auth));
    }
    let key = ring.get(&e.key_id).ok_or_else(|| AuthError::UnknownKey(e.key_id.chars().take(64).collect()))?;
    let mac = hex::decode(&e.mac).map_err(|_| AuthError::BadMac(key.id.clone()))?;
    mac_of(key, dir, &e.key_id, e.ts_ms, &e.nonce, &e.payload)
        .verify_slice(&mac)
        .map_err(|_| AuthError::BadMac(key.id.clone()))?;
    Ok((e, key))
}
