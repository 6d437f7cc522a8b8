//! Dead letters: a message that can never be handled, with the reason, for the dead-letter
//! topic. A dead letter must itself be small enough for the broker: a payload past
//! [`PAYLOAD_LIMIT`] bytes is cut to its first bytes, and the dead letter says so
//! (`truncated`) with the original size and its SHA-256, so the message can still be found
//! at its producer.

use gpusanity_common::wire::job::DeadLetter;
use gpusanity_common::wire::WIRE_VERSION;
use sha2::{Digest, Sha256};

/// The most bytes of a refused message a dead letter carries. JSON escaping can make a byte
/// six (a control character as `\u0000`), so a dead letter stays far below the broker's 1 MB.
pub const PAYLOAD_LIMIT: usize = 16 * 1024;

/// A dead letter for the message read at `topic`/`partition`/`offset`; its id is derived from
/// where it was read, so a redelivery of the same message gets the same one.
pub fn dead_letter(topic: &str, partition: i32, offset: i64, payload: &[u8], reason: &str) -> DeadLetter {
    let truncated = payload.len() > PAYLOAD_LIMIT;
    let kept = if truncated { cut(payload, PAYLOAD_LIMIT) } else { payload };
    DeadLetter {
        version: WIRE_VERSION,
        event_id: format!("dead-letter/{topic}/{partition}/{offset}"),
        reason: reason.into(),
        topic: topic.into(),
        partition,
        offset,
        payload: String::from_utf8_lossy(kept).into_owned(),
        truncated,
        payload_size: u64::try_from(payload.len()).unwrap_or(u64::MAX),
        payload_sha256: hex::encode(Sha256::digest(payload)),
        at: chrono::Utc::now(),
    }
}

/// The first at most `limit` bytes of `bytes`, not ending inside a UTF-8 character when the
/// text is UTF-8 there.
fn cut(bytes: &[u8], limit: usize) -> &[u8] {
    let mut end = limit.min(bytes.len());
    // A UTF-8 continuation byte (10xxxxxx) at `end` means a character is split: step back
    // to its start (at most 3 bytes).
    let mut back = 0;
    while end > 0 && back < 3 && bytes.get(end).is_some_and(|b| b & 0xC0 == 0x80) {
        end -= 1;
        back += 1;
    }
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_payload_is_cut_with_its_size_and_hash() {
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let dl = dead_letter("t", 0, 7, &big, "malformed");
        assert!(dl.truncated);
        assert_eq!(dl.payload_size, 1_000_000);
        assert_eq!(dl.payload_sha256, hex::encode(Sha256::digest(&big)));
        let json = serde_json::to_string(&dl).unwrap();
        assert!(json.len() < 200_000, "{} bytes", json.len());
        let small = dead_letter("t", 0, 8, b"{\"x\":1}", "malformed");
        assert!(!small.truncated);
        assert_eq!(small.payload, "{\"x\":1}");
        assert!(!serde_json::to_string(&small).unwrap().contains("truncated"));
    }

    #[test]
    fn a_cut_does_not_split_a_character() {
        let text = "é".repeat(PAYLOAD_LIMIT);
        let dl = dead_letter("t", 0, 1, text.as_bytes(), "r");
        assert!(dl.truncated);
        assert!(!dl.payload.contains('\u{FFFD}'));
        assert_eq!(dl.payload.len(), PAYLOAD_LIMIT);
    }
}
