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

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use thiserror::Error;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET: usize = 32;
/// Most keys in one file: a key per node for 16,384 nodes.
pub const MAX_KEYS: usize = 16_384;
/// Largest key file read (a key bound to one node takes about 130 bytes).
const MAX_FILE_BYTES: u64 = 4 << 20;

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

/// A file's or a process's (effective) user and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// This process's effective user and group.
fn process() -> Owner {
    // SAFETY: geteuid and getegid take no arguments, touch no memory and cannot fail (POSIX).
    // nix's wrappers need its `user` feature, which nothing else here wants.
    let (uid, gid) = unsafe { (nix::libc::geteuid(), nix::libc::getegid()) };
    Owner { uid, gid }
}

/// Whether a key file of `mode` owned by `file` may be read by `process`.
///
/// Who may read the secrets decides who may act as an agent. Readable by its owner alone
/// (0600, 0400) is always accepted. A file others may read (any of 0o007) is always refused.
/// Readable by its group too (0640, 0440: what a Kubernetes Secret volume with `defaultMode:
/// 0440` and the pod's `fsGroup` gives, the file root's and the group fsGroup) is accepted
/// only when the group can read and nothing more (no group write or execute), the file
/// belongs to root or to this process's user, and its group is this process's own effective
/// group: the group's members are then this process's own kind (in a pod: its containers
/// running as `runAsGroup` = `fsGroup`), not other users of the machine. A file of another
/// user, or group-readable by a group the process does not run as, is refused.
pub fn mode_allows(mode: u32, file: Owner, process: Owner) -> Result<(), &'static str> {
    if mode & 0o007 != 0 {
        return Err("others may read it: chmod 600 it");
    }
    match mode & 0o070 {
        0 => Ok(()),
        0o040 if (file.uid == 0 || file.uid == process.uid) && file.gid == process.gid => Ok(()),
        0o040 => {
            Err("its group may read it and is not this process's group (or its owner is another user): chmod 600 it")
        }
        _ => Err("its group may write or execute it: chmod 600 it"),
    }
}

/// The keys in file order, indexed: every report and task looks up its key by id, and every
/// task its node's signer, so a ring of a key per node answers both without a scan.
#[derive(Debug, Clone)]
pub struct Keyring {
    keys: Vec<Key>,
    by_id: HashMap<String, usize>,
    /// The first key bound to each node that a key names.
    by_node: HashMap<String, usize>,
    /// The first cluster key (one without `nodes`).
    cluster: Option<usize>,
}

impl Keyring {
    /// Reads the key file; a file others may read is refused ([`mode_allows`]: it holds the
    /// secrets).
    pub fn load(path: &Path) -> Result<Keyring, KeyError> {
        use std::os::unix::fs::MetadataExt;
        let read = |why: String| KeyError::Read { path: path.display().to_string(), why };
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        let file = Owner { uid: meta.uid(), gid: meta.gid() };
        mode_allows(meta.mode(), file, process()).map_err(|why| read(why.into()))?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(read(format!("larger than {} MiB", MAX_FILE_BYTES >> 20)));
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
        let mut by_node = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            for n in k.nodes.iter().flatten() {
                by_node.entry(n.clone()).or_insert(i);
            }
        }
        let by_id = keys.iter().enumerate().map(|(i, k)| (k.id.clone(), i)).collect();
        let cluster = keys.iter().position(|k| k.nodes.is_none());
        Ok(Keyring { keys, by_id, by_node, cluster })
    }

    /// The key that signs messages to or for `node`: the first in the file that covers it.
    pub fn signer_for(&self, node: &str) -> Option<&Key> {
        let first = match (self.by_node.get(node).copied(), self.cluster) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        first.map(|i| &self.keys[i])
    }

    /// The first key of the file (derives the runs' rendezvous secrets).
    pub fn first(&self) -> &Key {
        // parse() refuses an empty file.
        &self.keys[0]
    }

    pub fn get(&self, id: &str) -> Option<&Key> {
        self.by_id.get(id).map(|&i| &self.keys[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn a_group_readable_file_is_accepted_only_in_this_process_group_and_never_world_readable() {
        let me = Owner { uid: 65532, gid: 65532 };
        let root_fsgroup = Owner { uid: 0, gid: 65532 };
        for (mode, file) in [(0o600, me), (0o400, me), (0o440, root_fsgroup), (0o640, me), (0o100600, me)] {
            assert_eq!(mode_allows(mode, file, me), Ok(()), "{mode:o} {file:?}");
        }
        for (mode, file, why) in [
            (0o644, me, "others"),
            (0o604, me, "others"),
            (0o444, root_fsgroup, "others"),
            (0o440, Owner { uid: 0, gid: 100 }, "group"),
            (0o440, Owner { uid: 1000, gid: 65532 }, "owner"),
            (0o460, root_fsgroup, "write"),
            (0o650, me, "execute"),
        ] {
            let e = mode_allows(mode, file, me).expect_err("refused");
            assert!(e.contains(why), "{mode:o} {file:?}: {e}");
        }
    }

    #[test]
    fn load_reads_a_file_of_this_process_group_and_refuses_a_world_readable_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, format!("[[key]]\nid = \"a\"\nsecret = \"{A}\"\n")).expect("write");
        // A new file is this process's user's and group's (no setgid folder in a temp dir).
        for mode in [0o600, 0o640, 0o440] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert!(Keyring::load(&path).is_ok(), "{mode:o}");
        }
        for mode in [0o644, 0o604, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = Keyring::load(&path).expect_err("refused").to_string();
            assert!(e.contains("chmod 600"), "{mode:o}: {e}");
        }
    }

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

    /// A key per node for a 16,384-node fleet fits the file; the first key of the file that
    /// covers a node signs for it, whether a cluster key or a node key comes first; one key
    /// more is refused.
    #[test]
    fn a_key_per_node_of_a_large_fleet_and_the_first_covering_key_signs() {
        let node_key = |k: usize| format!("[[key]]\nid = \"n{k}\"\nsecret = \"{A}\"\nnodes = [\"node-{k}\"]\n");
        let text: String = (0..MAX_KEYS).map(node_key).collect();
        assert!(text.len() as u64 <= MAX_FILE_BYTES, "{} bytes", text.len());
        let ring = Keyring::parse(&text).unwrap();
        assert_eq!(ring.signer_for("node-16383").unwrap().id, "n16383");
        assert!(ring.signer_for("node-16384").is_none());
        assert_eq!(ring.get("n77").unwrap().id, "n77");
        let more = format!("{text}{}", node_key(MAX_KEYS));
        assert!(Keyring::parse(&more).unwrap_err().to_string().contains("more than 16384 keys"));
        let cluster = format!("[[key]]\nid = \"all\"\nsecret = \"{A}\"\n");
        let first = Keyring::parse(&format!("{cluster}{}", node_key(1))).unwrap();
        assert_eq!(first.signer_for("node-1").unwrap().id, "all");
        let last = Keyring::parse(&format!("{}{}{cluster}", node_key(1), node_key(1).replace("n1\"", "m1\""))).unwrap();
        assert_eq!(last.signer_for("node-1").unwrap().id, "n1");
        assert_eq!(last.signer_for("node-2").unwrap().id, "all");
    }
}
