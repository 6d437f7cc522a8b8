//! The run's secret and the proofs made with it: HMAC-SHA256 over a label, both sides' fresh
//! nonces and what the connection is for. Shared by the store's handshake and the CPU
//! transport's hello ([`hello_accept`], [`hello_connect`]).
//!
//! Every proof covers a nonce that the verifying side drew for this connection alone, so a
//! proof captured on one connection is worthless on the next. The answering side proves itself
//! too (its proof covers the other's nonce), so a process that took the port first without the
//! secret cannot pose as the store or as a peer either.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;
use thiserror::Error;

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// The environment variable a launcher reads its secret from (after `--rdzv-secret-file`).
pub const SECRET_ENV: &str = "GPUSANITY_RDZV_SECRET";
/// Bytes of a nonce; a proof is as long (SHA-256).
pub const NONCE_LEN: usize = 32;
/// How long a peer has to complete a handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Labels that keep a proof made for one purpose from passing for another.
pub(crate) const STORE_LABEL: &[u8] = b"gpusanity-store-v1";
const CPU_LABEL: &[u8] = b"gpusanity-cpu-v1";

/// The per-run secret shared by every launcher and worker of a run. Its `Debug` shows no byte
/// of it; it travels to the workers as hex inside their spec, never on a command line.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

#[derive(Debug, Error)]
pub enum SecretError {
    #[error("cannot read the rendezvous secret file {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("the rendezvous secret from {from} is {len} bytes: it must be at least {MIN_SECRET_LEN} bytes (e.g. `head -c 32 /dev/urandom | base64`)")]
    TooShort { from: String, len: usize },
}

impl Secret {
    /// A secret from `bytes`, trailing whitespace trimmed; `from` names the source in errors.
    pub fn new(bytes: &[u8], from: &str) -> Result<Secret, SecretError> {
        let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
        let bytes = &bytes[..end];
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort { from: from.into(), len: bytes.len() });
        }
        Ok(Secret(bytes.to_vec()))
    }

    /// The content of `path`. A file that group or others may read is used, with a warning.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        use std::os::unix::fs::PermissionsExt;
        let err = |err| SecretError::Read { path: path.display().to_string(), err };
        let bytes = std::fs::read(path).map_err(err)?;
        let secret = Secret::new(&bytes, &path.display().to_string())?;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    "the rendezvous secret file {} may be read by other users (mode {:o}): chmod 600 it",
                    path.display(),
                    meta.permissions().mode() & 0o777
                );
            }
        }
        Ok(secret)
    }

    /// A random secret, for tests.
    pub fn random() -> Secret {
        Secret(nonce().to_vec())
    }

    fn key(secret: Option<&Secret>) -> &[u8] {
        secret.map_or(&[], |s| s.0.as_slice())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = hex::decode(text).map_err(serde::de::Error::custom)?;
        Secret::new(&bytes, "the worker spec").map_err(serde::de::Error::custom)
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut n);
    n
}

fn mac(secret: Option<&Secret>, parts: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes a key of any length (the empty one when the run has no secret).
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(Secret::key(secret)).unwrap_or_else(|_| unreachable!());
    for p in parts {
        // Length-prefixed, so no two different lists of parts read the same.
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m
}

/// The proof over `parts`.
pub fn prove(secret: Option<&Secret>, parts: &[&[u8]]) -> [u8; NONCE_LEN] {
    mac(secret, parts).finalize().into_bytes().into()
}

/// Whether `proof` is the proof over `parts` (in constant time).
pub fn verify(secret: Option<&Secret>, parts: &[&[u8]], proof: &[u8]) -> bool {
    mac(secret, parts).verify_slice(proof).is_ok()
}

/// Why a CPU transport hello failed.
#[derive(Debug, Error)]
pub enum HelloError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the peer's proof is wrong (not a rank of this run: a different or no rendezvous secret)")]
    BadProof,
}

/// The accepting side of a CPU transport connection of group `ctx`: sends a nonce, reads the
/// peer's index, nonce and proof, checks it and proves itself back. Returns the peer's index.
/// Every read has [`HANDSHAKE_TIMEOUT`].
pub fn hello_accept(s: &mut TcpStream, secret: Option<&Secret>, ctx: &str) -> Result<u64, HelloError> {
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let ours = nonce();
    s.write_all(&ours)?;
    let mut msg = [0u8; 8 + 2 * NONCE_LEN];
    s.read_exact(&mut msg)?;
    let (index, rest) = msg.split_at(8);
    let (theirs, proof) = rest.split_at(NONCE_LEN);
    if !verify(secret, &[CPU_LABEL, b"client", ctx.as_bytes(), &ours, theirs, index], proof) {
        return Err(HelloError::BadProof);
    }
    s.write_all(&prove(secret, &[CPU_LABEL, b"server", ctx.as_bytes(), &ours, theirs, index]))?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    let mut idx = [0u8; 8];
    idx.copy_from_slice(index);
    Ok(u64::from_le_bytes(idx))
}

/// The connecting side of [`hello_accept`]: this rank is `index` of group `ctx`. The peer's
/// challenge may take up to `wait` (the peer accepts once its own set-up allows), its proof
/// [`HANDSHAKE_TIMEOUT`].
pub fn hello_connect(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    ctx: &str,
    index: u64,
    wait: Duration,
) -> Result<(), HelloError> {
    s.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut theirs = [0u8; NONCE_LEN];
    s.read_exact(&mut theirs)?;
    let ours = nonce();
    let idx = index.to_le_bytes();
    let proof = prove(secret, &[CPU_LABEL, b"client", ctx.as_bytes(), &theirs, &ours, &idx]);
    let mut msg = Vec::with_capacity(8 + 2 * NONCE_LEN);
    msg.extend_from_slice(&idx);
    msg.extend_from_slice(&ours);
    msg.extend_from_slice(&proof);
    s.write_all(&msg)?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut back = [0u8; NONCE_LEN];
    s.read_exact(&mut back)?;
    if !verify(secret, &[CPU_LABEL, b"server", ctx.as_bytes(), &theirs, &ours, &idx], &back) {
        return Err(HelloError::BadProof);
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_trimmed_bounded_and_never_printed() {
        let s = Secret::new(b"0123456789abcdef \n", "test").unwrap();
        assert_eq!(s, Secret::new(b"0123456789abcdef", "test").unwrap());
        assert_eq!(format!("{s:?}"), "Secret(16 bytes)");
        let err = Secret::new(b"short\n\n", "GPUSANITY_RDZV_SECRET").unwrap_err().to_string();
        assert!(err.contains("is 5 bytes") && err.contains("at least 16"), "{err}");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), s);
    }

    #[test]
    fn cpu_hello_checks_both_sides() {
        let secret = Secret::random();
        let other = Secret::random();
        for (theirs, ok) in [(Some(secret.clone()), true), (Some(other), false), (None, false)] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                hello_connect(&mut s, theirs.as_ref(), "g", 3, HANDSHAKE_TIMEOUT).is_ok()
            });
            let (mut s, _) = l.accept().unwrap();
            let got = hello_accept(&mut s, Some(&secret), "g");
            drop(s);
            assert_eq!(got.is_ok(), ok, "{got:?}");
            if ok {
                assert_eq!(got.unwrap(), 3);
            }
            assert_eq!(t.join().unwrap(), ok);
        }
    }
}
