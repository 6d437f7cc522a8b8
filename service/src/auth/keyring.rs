//! The agent keys: a TOML file of HMAC keys shared by the service and the agents.
//!
//! ```toml
//! [[key]]
//! id = "2026-12"            # named in every message it signs
//! secret = "64+ hex digits" # 32 bytes or more (openssl rand -hex 32)
//! nodes = ["gpu-017"]       # optional: the key speaks for these nodes only
//! ```
//!
//! The first key that covers a node signs what is sent to or for it; every key in the file is
//! accepted, so a key rotates without downtime: add the new key second everywhere, move it
//! first, then remove the old one. A key without `nodes` is a cluster key; a key with `nodes`
//! lets a stolen node key speak for that node alone.

use std::collections::BTreeSet;
use std::path::Path;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use thiserror::Error;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET: usize = 32;
/// Most keys in one file.
const MAX_KEYS: usize = 64;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("reading the agent keys {path}: {why}")]
    Read { path: String, why: String },
    #[error("agent keys: {0}")]
    Bad(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    id: String,
    secret: String,
    #[serde(default)]
    nodes: Option<Vec<String>>,
}

/// One HMAC key.
#[derive(Clone)]
pub struct Key {
    pub id: String,
    secret: Vec<u8>,
    /// None: any node.
    nodes: Option<BTreeSet<String>>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &self.id).field("nodes", &self.nodes).finish_non_exhaustive()
    }
}

impl Key {
    /// HMAC-SHA256 under this key over `parts`, each followed by a NUL (so that no two lists
    /// of parts give the same input), not yet finalized.
    pub fn mac(&self, parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC takes a key of any length: new_from_slice cannot fail here.
        let mut m =
            Hmac::<Sha256>::new_from_slice(&self.secret).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        for p in parts {
            m.update(p);
            m.update(&[0]);
        }
        m
    }

    /// Whether this key may speak for `node`.
    pub fn covers(&self, node: &str) -> bool {
        self.nodes.as_ref().is_none_or(|n| n.contains(node))
    }
}

#[derive(Debug, Clone)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl Keyring {
    /// Reads the key file; a file others can read is refused (it holds the secrets).
    pub fn load(path: &Path) -> Result<Keyring, KeyError> {
        let read = |why: String| KeyError::Read { path: path.display().to_string(), why };
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(read("group or others may read it: chmod 600 it".into()));
            }
        }
        if meta.len() > 1 << 20 {
            return Err(read("larger than 1 MiB".into()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        Keyring::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Keyring, KeyError> {
        let file: KeyFile = toml::from_str(text).map_err(|e| KeyError::Bad(e.to_string().replace('\n', " ")))?;
        if file.key.is_empty() {
            return Err(KeyError::Bad("no [[key]] in the file".into()));
        }
        if file.key.len() > MAX_KEYS {
            return Err(KeyError::Bad(format!("more than {MAX_KEYS} keys")));
        }
        let mut ids = BTreeSet::new();
        let mut keys = Vec::with_capacity(file.key.len());
        for e in file.key {
            let id_ok = !e.id.is_empty()
                && e.id.len() <= 64
                && e.id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !id_ok {
                return Err(KeyError::Bad(format!("key id `{}`: 1-64 letters, digits, - _ .", e.id.escape_debug())));
            }
            if !ids.insert(e.id.clone()) {
                return Err(KeyError::Bad(format!("key id `{}` twice", e.id)));
            }
            let secret = hex::decode(e.secret.trim())
                .map_err(|_| KeyError::Bad(format!("key `{}`: the secret is not hex", e.id)))?;
            if secret.len() < MIN_SECRET {
                return Err(KeyError::Bad(format!(
                    "key `{}`: the secret is {} bytes, at least {MIN_SECRET} are needed (openssl rand -hex 32)",
                    e.id,
                    secret.len()
                )));
            }
            let nodes = match e.nodes {
                Some(n) if n.is_empty() => return Err(KeyError::Bad(format!("key `{}`: empty `nodes`", e.id))),
                n => n.map(|v| v.into_iter().collect()),
            };
            keys.push(Key { id: e.id, secret, nodes });
        }
        Ok(Keyring { keys })
    }

    /// The key that signs messages to or for `node`: the first that covers it.
    pub fn signer_for(&self, node: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.covers(node))
    }

    /// The first key of the file (derives the runs' rendezvous secrets).
    pub fn first(&self) -> &Key {
        // parse() refuses an empty file.
        &self.keys[0]
    }

    pub fn get(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn keys_parse_with_their_node_bindings_and_bad_files_say_why() {
        let ring = Keyring::parse(&format!(
            "[[key]]\nid = \"n1\"\nsecret = \"{A}\"\nnodes = [\"node-1\"]\n[[key]]\nid = \"all\"\nsecret = \"{A}\"\n"
        ))
        .unwrap();
        assert_eq!(ring.signer_for("node-1").unwrap().id, "n1");
        assert_eq!(ring.signer_for("node-2").unwrap().id, "all");
        assert!(ring.get("n1").is_some_and(|k| !k.covers("node-2")));
        for (bad, why) in [
            ("", "no [[key]]"),
            ("[[key]]\nid = \"a\"\nsecret = \"abcd\"\n", "at least 32"),
            ("[[key]]\nid = \"a\"\nsecret = \"zz\"\n", "not hex"),
            ("[[key]]\nid = \"a/b\"\nsecret = \"00\"\n", "key id"),
            ("[[key]]\nid = \"a\"\nsecret = \"00\"\nextra = 1\n", "unknown field"),
        ] {
            let e = Keyring::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let twice = format!("[[key]]\nid = \"a\"\nsecret = \"{A}\"\n[[key]]\nid = \"a\"\nsecret = \"{A}\"\n");
        assert!(Keyring::parse(&twice).unwrap_err().to_string().contains("twice"));
    }
}
