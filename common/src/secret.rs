//! Comparing secrets (API tokens, session values).

/// Constant-time comparison, so a secret cannot be guessed byte by byte from timings.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[test]
fn only_equal_secrets_are_the_same() {
    assert!(same(b"token-1", b"token-1"));
    assert!(!same(b"token-1", b"token-2"));
    assert!(!same(b"token", b"token-1"));
    assert!(same(b"", b""));
}
