//! The cost of the agent protocol's authentication (bench/auth_cost.sh runs this): sealing and
//! opening a heartbeat-sized and a result-sized message (HMAC-SHA256 over the payload, the
//! freshness window and the nonce guard), per message, beside the service's own latency.
//!
//! Usage: auth_cost [MESSAGES]

use std::time::{Duration, Instant};

use gpusanity_service::auth::{envelope, Direction, Keyring, Verifier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(20_000);
    let ring = Keyring::parse(&format!("[[key]]\nid = \"bench\"\nsecret = \"{}\"\n", "a5".repeat(32)))?;
    for (what, bytes) in [("heartbeat", 200usize), ("result with a report", 256 << 10), ("largest result", 4 << 20)] {
        let payload = format!("{{\"pad\":\"{}\"}}", "x".repeat(bytes));
        let mut v = Verifier::new(ring.clone(), Duration::from_secs(600));
        let count = if bytes > 1 << 20 {
            (n / 100).max(10)
        } else if bytes > 1000 {
            (n / 10).max(10)
        } else {
            n
        };
        let sealed: Vec<String> =
            (0..count).map(|_| envelope::seal(ring.first(), Direction::Report, payload.clone())).collect();
        let t = Instant::now();
        for _ in 0..count {
            std::hint::black_box(envelope::seal(ring.first(), Direction::Report, payload.clone()));
        }
        let seal_us = t.elapsed().as_secs_f64() * 1e6 / count as f64;
        let t = Instant::now();
        for s in &sealed {
            v.open(Direction::Report, s.as_bytes())?;
        }
        let open_us = t.elapsed().as_secs_f64() * 1e6 / count as f64;
        println!(
            "{what:>22} ({bytes:>8} B): seal {seal_us:9.1} us, open {open_us:9.1} us per message ({count} messages)"
        );
    }
    Ok(())
}
