//! Each run's rendezvous secret (it authenticates the launchers' store and transport, see
//! docs/security.md) and how it reaches the run's nodes.
//!
//! The secret is derived from the ring's first key and the run id, so a restarted service hands
//! the nodes of a run the same secret it gave them before. Each node receives it sealed under
//! the key that signs its task: XOR with HMAC(key, "gpusanity-rendezvous-seal" run node),
//! a pad unique to (key, run, node), so a reader of the tasks topic without that key learns
//! nothing of it; the envelope's MAC protects it from being altered.

use hmac::Mac;

use super::keyring::Key;

/// Bytes of a run's secret.
pub const SECRET_LEN: usize = 32;

fn prf(key: &Key, parts: &[&[u8]]) -> [u8; SECRET_LEN] {
    key.mac(parts).finalize().into_bytes().into()
}

/// The rendezvous secret of `run_id`.
pub fn run_secret(first: &Key, run_id: &str) -> [u8; SECRET_LEN] {
    prf(first, &[b"gpusanity-rendezvous-secret", run_id.as_bytes()])
}

/// `secret` sealed for `node` of `run_id` under `key`, as hex.
pub fn seal(key: &Key, run_id: &str, node: &str, secret: &[u8; SECRET_LEN]) -> String {
    let pad = prf(key, &[b"gpusanity-rendezvous-seal", run_id.as_bytes(), node.as_bytes()]);
    hex::encode(std::array::from_fn::<u8, SECRET_LEN, _>(|i| secret[i] ^ pad[i]))
}

/// The secret of a sealed value (None when it is not a sealed secret).
pub fn unseal(key: &Key, run_id: &str, node: &str, sealed: &str) -> Option<[u8; SECRET_LEN]> {
    let bytes: [u8; SECRET_LEN] = hex::decode(sealed).ok()?.try_into().ok()?;
    let pad = prf(key, &[b"gpusanity-rendezvous-seal", run_id.as_bytes(), node.as_bytes()]);
    Some(std::array::from_fn(|i| bytes[i] ^ pad[i]))
}

#[cfg(test)]
mod tests {
    use super::super::Keyring;
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_for_its_run_and_node() {
        let ring = Keyring::parse(&format!("[[key]]\nid = \"k\"\nsecret = \"{}\"\n", "12".repeat(32))).unwrap();
        let k = ring.first();
        let s = run_secret(k, "run-1");
        assert_eq!(s, run_secret(k, "run-1"));
        assert_ne!(s, run_secret(k, "run-2"));
        let sealed = seal(k, "run-1", "n1", &s);
        assert_ne!(sealed, hex::encode(s));
        assert_eq!(unseal(k, "run-1", "n1", &sealed), Some(s));
        assert_ne!(unseal(k, "run-1", "n2", &sealed), Some(s));
        assert_eq!(unseal(k, "run-1", "n1", "zz"), None);
    }
}
