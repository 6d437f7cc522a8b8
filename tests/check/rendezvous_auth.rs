//! The rendezvous secret, through the real binary: runs with a secret pass, forged keys from a
//! client without it change nothing, a huge line does not grow the launcher, a single node
//! listens on loopback only, a bad secret is bad input.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use gpusanity_testkit::common::*;
use gpusanity_testkit::skip::{missing, Prereq};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const LIMIT: Duration = Duration::from_secs(90);
const SECRET: &str = "a-test-secret-of-the-run-0123456789";
const QUICK: &str = "--micro-benchmarks=gemm";

/// One node of a loopback job with `extra` flags and `env`, one worker, output piped.
fn node(run: &Run, extra: &[&str], env: &[(&str, &str)], nnodes: usize, rank: usize, port: u16) -> Child {
    let (n, r, p) = (nnodes.to_string(), rank.to_string(), port.to_string());
    // The topology first: `extra` may end with `-- COMMAND`.
    let mut args = vec!["--nnodes", &n, "--node-rank", &r, "--nproc-per-node", "1"];
    args.extend(["--master-addr", "127.0.0.1", "--master-port", &p]);
    args.extend(extra);
    let mut c = run.command(&args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("spawn gpusanity")
}

/// A secret file of mode 0600 in the run's folder.
fn secret_file(run: &Run) -> String {
    let path = run.dir.path().join("rdzv.secret");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_string_lossy().into_owned()
}

/// A connection to the store that read its challenge.
struct Raw {
    r: BufReader<TcpStream>,
    w: TcpStream,
    nonce: Vec<u8>,
}

impl Raw {
    /// Waits until the store at `port` answers.
    fn connect(port: u16, limit: Duration) -> Raw {
        let start = Instant::now();
        loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut l = String::new();
                if r.read_line(&mut l).is_ok_and(|n| n > 0) {
                    let hello: serde_json::Value = serde_json::from_str(&l).unwrap();
                    let nonce = hex::decode(hello["nonce"].as_str().unwrap()).unwrap();
                    return Raw { r, w: s, nonce };
                }
            }
            assert!(start.elapsed() < limit, "the store on port {port} never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `line`; the reply, or None when the store closed the connection.
    fn call(&mut self, line: &str) -> Option<serde_json::Value> {
        self.w.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(n) if n > 0 => serde_json::from_str(&l).ok(),
            _ => None,
        }
    }

    /// The handshake with `secret` (the store's proof format: length-prefixed parts).
    fn auth(&mut self, secret: &[u8]) -> Option<serde_json::Value> {
        let ours = [7u8; 32];
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap();
        for p in [&b"gpusanity-store-v1"[..], b"client", &self.nonce, &ours] {
            m.update(&(p.len() as u64).to_le_bytes());
            m.update(p);
        }
        let proof = hex::encode(m.finalize().into_bytes());
        self.call(&serde_json::json!({"op": "auth", "nonce": hex::encode(ours), "proof": proof}).to_string())
    }
}

/// Sets `key` to `value` without the secret, in every way a stranger could: no handshake, a
/// made-up proof. Panics if the store ever accepts.
fn forge(port: u16, key: &str, value: &str) {
    let set = serde_json::json!({"op": "set", "key": key, "value": value}).to_string();
    let mut a = Raw::connect(port, LIMIT);
    let r = a.call(&set);
    assert!(r.as_ref().is_none_or(|r| r["ok"] == false), "forged set without a handshake accepted: {r:?}");
    assert!(a.call(&set).is_none(), "the connection stays open after a refused handshake");
    let mut b = Raw::connect(port, LIMIT);
    let r = b.auth(b"not-the-secret-at-all");
    assert!(r.as_ref().is_none_or(|r| r["ok"] == false), "a wrong proof accepted: {r:?}");
    assert!(b.call(&set).is_none(), "the connection stays open after a wrong proof");
}

#[test]
fn two_nodes_with_a_secret_from_a_file_and_from_the_environment_pass() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let file = secret_file(&run);
    // COMMAND does not inherit the secret.
    let cmd = ["--", "sh", "-c", "test -z \"$GPUSANITY_RDZV_SECRET\" && exit 42"];
    let n1 = node(&run, &[&[QUICK][..], &cmd].concat(), &[("GPUSANITY_RDZV_SECRET", SECRET)], 2, 1, port);
    let n0 = node(&run, &[&[QUICK, "--rdzv-secret-file", &file][..], &cmd].concat(), &[], 2, 0, port);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 42, "{}", stderr(&o0));
    assert_eq!(code(&o1), 42, "{}", stderr(&o1));
    assert!(!stderr(&o0).contains("unauthenticated"), "{}", stderr(&o0));
    assert_eq!(run.report()["status"], "passed");
    run.assert_nothing_left();
}

#[test]
fn without_a_secret_two_nodes_warn_once_and_pass() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let n1 = node(&run, &[QUICK], &[], 2, 1, port);
    let n0 = node(&run, &[QUICK], &[], 2, 0, port);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 0, "{}", stderr(&o0));
    assert_eq!(code(&o1), 0, "{}", stderr(&o1));
    assert_eq!(stderr(&o0).matches("unauthenticated").count(), 1, "{}", stderr(&o0));
    run.assert_nothing_left();
}

#[test]
fn a_forged_verdict_does_not_make_a_faulty_node_run_command() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let extra =
        [QUICK, "--test-faults", "--sanity-check-envs=GPUSANITY_FAULT=gemm-wrong@1", "--", "sh", "-c", "exit 42"];
    let env = [("GPUSANITY_RDZV_SECRET", SECRET)];
    let n0 = node(&run, &extra, &env, 2, 0, port);
    // Before node 1 even arrives, and again while the run goes on.
    let passed = r#"{"status":"passed","summary":"forged","hold":false}"#;
    forge(port, "verdict", passed);
    let n1 = node(&run, &extra, &env, 2, 1, port);
    forge(port, "verdict", passed);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 1, "{}", stderr(&o0));
    assert_eq!(code(&o1), 1, "node 1 must not run COMMAND: {}", stderr(&o1));
    assert_eq!(run.report()["status"], "failed");
    run.assert_nothing_left();
}

#[test]
fn a_forged_abort_does_not_fail_a_healthy_run() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let env = [("GPUSANITY_RDZV_SECRET", SECRET)];
    let n0 = node(&run, &[QUICK], &env, 2, 0, port);
    let abort = r#"{"kind":"rank_failed","node_rank":1,"rank":1,"reason":"forged by a stranger"}"#;
    forge(port, "abort", abort);
    let n1 = node(&run, &[QUICK], &env, 2, 1, port);
    forge(port, "abort", abort);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 0, "{}", stderr(&o0));
    assert_eq!(code(&o1), 0, "{}", stderr(&o1));
    let r = run.report();
    assert_eq!(r["status"], "passed");
    assert!(!r.to_string().contains("forged"), "{r}");
    // The refusals are logged once per address, not once per connection.
    assert_eq!(stderr(&o0).matches("closed a connection from").count(), 1, "{}", stderr(&o0));
    run.assert_nothing_left();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Writes up to `total` bytes with no newline; true when the store closed the connection first.
fn flood(mut s: TcpStream, total: usize) -> bool {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let chunk = vec![b'x'; 256 << 10];
    let mut sent = 0;
    while sent < total {
        if let Err(e) = s.write_all(&chunk) {
            return !matches!(e.kind(), WouldBlock | TimedOut);
        }
        sent += chunk.len();
    }
    false
}

#[test]
fn a_line_without_newline_is_dropped_and_the_launcher_stays_small() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let env = [("GPUSANITY_RDZV_SECRET", SECRET)];
    // Node 0 waits for node 1 at the rendezvous: its store is up and idle.
    let n0 = node(&run, &[QUICK, "--rdzv-timeout=60"], &env, 2, 0, port);
    let pid = n0.id();
    let _ = Raw::connect(port, LIMIT);
    let before = rss_kib(pid);
    // A stranger's endless handshake line, and a key holder's requests far past the line limit
    // (2 MiB and more, with no newline).
    let stranger = Raw::connect(port, LIMIT);
    assert!(flood(stranger.w, 64 << 20), "a 64 MiB line before the handshake was read on");
    for _ in 0..4 {
        let mut holder = Raw::connect(port, LIMIT);
        assert_eq!(holder.auth(SECRET.as_bytes()).unwrap()["ok"], true);
        assert!(flood(holder.w, 64 << 20), "a 64 MiB line was read on");
    }
    let after = rss_kib(pid);
    assert!(after < before + 32 * 1024, "the launcher grew from {before} KiB to {after} KiB");
    // The store still serves the run.
    let n1 = node(&run, &[QUICK], &env, 2, 1, port);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 0, "{}", stderr(&o0));
    assert_eq!(code(&o1), 0, "{}", stderr(&o1));
    run.assert_nothing_left();
}

/// This host's address on its default route, if it has one that is not loopback.
fn non_loopback_ip() -> Option<IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connect only picks the route and the source address.
    s.connect("10.255.255.1:9").or_else(|_| s.connect("192.0.2.1:9")).ok()?;
    Some(s.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// The local addresses of the TCP listening sockets that process `pid` holds.
fn listening(pid: i32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| l.to_string_lossy().strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default()
        + &std::fs::read_to_string(format!("/proc/{pid}/net/tcp6")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9])).then(|| f[1].to_string())
        })
        .collect()
}

#[test]
fn a_single_node_listens_on_loopback_only() {
    let _g = serial();
    let Some(ip) = non_loopback_ip() else {
        return missing(Prereq::Network, "this host has no non-loopback IPv4 address");
    };
    let run = Run::new();
    let port = free_port();
    let p = port.to_string();
    // The delayed start keeps the run (and its ring) up a moment.
    let mut c = run.command(&[
        "--micro-benchmarks=all-reduce",
        "--test-faults",
        "--sanity-check-envs=GPUSANITY_FAULT=delay-start@0",
        "--master-port",
        &p,
    ]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut store = Raw::connect(port, LIMIT);
    let err = TcpStream::connect_timeout(&(ip, port).into(), Duration::from_secs(2)).err();
    assert!(err.is_some(), "the store answers on {ip}:{port}");
    // The workers publish loopback addresses for their ring and mesh (and listen on them).
    assert_eq!(store.auth(b"").unwrap()["ok"], true);
    for key in ["cpu/ring/world/0", "cpu/ring/world/1", "cpu/mesh/world/0", "cpu/mesh/world/1"] {
        let get = serde_json::json!({"op": "get", "key": key, "timeout_ms": 30_000}).to_string();
        let r = store.call(&get).unwrap();
        assert!(r["value"].as_str().unwrap().starts_with("127.0.0.1:"), "{key}: {r}");
    }
    // Every listening socket of the launcher and its workers, while the run lasts.
    let mut seen = Vec::new();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() && start.elapsed() < LIMIT {
        let launcher = child.id() as i32;
        for pid in tagged_processes(&run.tag).into_iter().map(|(p, _)| p).chain([launcher]) {
            seen.extend(listening(pid));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = wait_output(child, LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    seen.sort();
    seen.dedup();
    // The store's at least; the workers' listeners live only while their ring and mesh form.
    assert!(!seen.is_empty());
    for a in &seen {
        assert!(a.starts_with("0100007F:") || a.starts_with("00000000000000000000000001000000:"), "{a} in {seen:?}");
    }
    run.assert_nothing_left();
}

#[test]
fn a_short_secret_or_a_missing_file_is_one_line_and_exit_2() {
    let _g = serial();
    let run = Run::new();
    let short = run.dir.path().join("short.secret");
    std::fs::write(&short, "too-short\n").unwrap();
    let missing = run.dir.path().join("nowhere.secret");
    let (short, missing) = (short.to_string_lossy().into_owned(), missing.to_string_lossy().into_owned());
    let env: &[(&str, &str)] = &[("GPUSANITY_RDZV_SECRET", "short")];
    let cases = [
        (&[][..], env, "at least 16 bytes"),
        (&["--rdzv-secret-file", short.as_str()][..], &[][..], "at least 16 bytes"),
        (&["--rdzv-secret-file", missing.as_str()][..], &[][..], "cannot read"),
    ];
    for (args, env, want) in cases {
        let mut c = run.command(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = run_with_timeout(c, Duration::from_secs(30));
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(want), "want `{want}` in {err}");
        assert!(!err.contains("too-short"), "the secret is printed: {err}");
    }
    run.assert_nothing_left();
}

#[test]
fn a_node_without_the_secret_is_refused_with_a_clear_error() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let n0 = node(&run, &[QUICK, "--rdzv-timeout=5"], &[("GPUSANITY_RDZV_SECRET", SECRET)], 2, 0, port);
    let n1 = node(&run, &[QUICK, "--rdzv-timeout=5"], &[], 2, 1, port);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o1), 2, "{}", stderr(&o1));
    assert!(stderr(&o1).contains("needs the run's secret"), "{}", stderr(&o1));
    // Node 0 names the node that never arrived.
    assert_eq!(code(&o0), 1, "{}", stderr(&o0));
    assert!(findings(&run.report()).iter().any(|(c, _)| c == "NODE_MISSING"));
    run.assert_nothing_left();
}
