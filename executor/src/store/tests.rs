use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::auth::{self, STORE_LABEL};
use super::*;

const WAIT: Duration = Duration::from_secs(5);

#[test]
fn set_get_wait_and_timeout() {
    let (_rt, addr) = test_store();
    let mut a = StoreClient::connect(&addr, WAIT, None).unwrap();
    let addr2 = addr.clone();
    let setter = std::thread::spawn(move || {
        let mut b = StoreClient::connect(&addr2, WAIT, None).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        b.set("k", "v\nwith newline").unwrap();
    });
    assert_eq!(a.get("k", WAIT).unwrap(), "v\nwith newline");
    setter.join().unwrap();
    let err = a.get("missing", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, StoreError::Timeout(..)), "{err}");
}

#[test]
fn unreachable_master_is_a_clear_error() {
    // Bind then drop to find a closed port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = StoreClient::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(300), None).err().unwrap();
    assert!(err.to_string().contains("cannot reach the rendezvous"), "{err}");
}

/// A hand-written client: the raw lines of the protocol.
struct Raw {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Raw {
    fn connect(addr: &str) -> (Raw, Vec<u8>) {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut raw = Raw { r: BufReader::new(s.try_clone().unwrap()), w: s };
        let hello: serde_json::Value = serde_json::from_str(&raw.line().unwrap()).unwrap();
        assert_eq!(hello["hello"], "gpusanity-store-v1");
        (raw, hex::decode(hello["nonce"].as_str().unwrap()).unwrap())
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// The next line, or None once the server closed the connection.
    fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(l),
        }
    }

    fn auth(&mut self, nonce: &[u8], proof: &[u8]) -> Option<serde_json::Value> {
        let req = serde_json::json!({"op": "auth", "nonce": hex::encode(nonce), "proof": hex::encode(proof)});
        self.send(&req.to_string());
        self.line().map(|l| serde_json::from_str(&l).unwrap())
    }

    /// Whether the server closed the connection (rather than leaving it silent).
    fn closed(&mut self) -> bool {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        let mut b = [0u8; 1];
        match self.r.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), WouldBlock | TimedOut),
        }
    }
}

#[test]
fn a_client_with_the_secret_is_served_and_one_without_it_is_not() {
    let secret = Secret::random();
    let (_rt, addr) = test_store_with(Some(secret.clone()));
    let mut good = StoreClient::connect(&addr, WAIT, Some(secret)).unwrap();
    good.set("k", "v").unwrap();
    assert_eq!(good.get("k", WAIT).unwrap(), "v");

    let err = StoreClient::connect(&addr, WAIT, Some(Secret::random())).err().unwrap().to_string();
    assert!(err.contains("refused") && err.contains("wrong proof"), "{err}");
    let err = StoreClient::connect(&addr, WAIT, None).err().unwrap().to_string();
    assert!(err.contains("needs the run's secret") && err.contains("GPUSANITY_RDZV_SECRET"), "{err}");

    // A store without a secret is refused by a client that has one (it may be an impostor).
    let (_rt2, open) = test_store();
    let err = StoreClient::connect(&open, WAIT, Some(Secret::random())).err().unwrap().to_string();
    assert!(err.contains("has no secret"), "{err}");
}

#[test]
fn a_bad_proof_a_replayed_proof_and_a_request_before_the_handshake_close_the_connection() {
    let secret = Secret::random();
    let (_rt, addr) = test_store_with(Some(secret.clone()));
    let ours = auth::nonce();

    // A good proof, by hand.
    let (mut a, theirs) = Raw::connect(&addr);
    let proof = auth::prove(Some(&secret), &[STORE_LABEL, b"client", &theirs, &ours]);
    let reply = a.auth(&ours, &proof).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    a.send(r#"{"op":"set","key":"k","value":"v"}"#);
    assert!(a.line().unwrap().contains("\"ok\":true"));

    // The same handshake replayed on a new connection: its challenge is new, the proof fails.
    let (mut b, theirs2) = Raw::connect(&addr);
    assert_ne!(theirs, theirs2);
    let reply = b.auth(&ours, &proof).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(b.closed());

    // A proof made with another secret.
    let (mut c, theirs3) = Raw::connect(&addr);
    let wrong = auth::prove(Some(&Secret::random()), &[STORE_LABEL, b"client", &theirs3, &ours]);
    assert_eq!(c.auth(&ours, &wrong).unwrap()["ok"], false);
    assert!(c.closed());

    // A forged verdict with no handshake at all.
    let (mut d, _) = Raw::connect(&addr);
    d.send(r#"{"op":"set","key":"verdict","value":"{\"status\":\"passed\"}"}"#);
    assert!(d.line().unwrap().contains("\"ok\":false"));
    assert!(d.closed());
    let mut good = StoreClient::connect(&addr, WAIT, Some(secret)).unwrap();
    assert!(matches!(good.get("verdict", Duration::from_millis(50)), Err(StoreError::Timeout(..))));
}

#[test]
fn a_silent_peer_is_closed_after_the_handshake_deadline() {
    let (_rt, addr) = test_store_with(Some(Secret::random()));
    let (mut a, _) = Raw::connect(&addr);
    let start = Instant::now();
    assert!(a.closed());
    let took = start.elapsed();
    assert!(took >= auth::HANDSHAKE_TIMEOUT - Duration::from_millis(500) && took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn a_line_over_the_limit_closes_its_connection_and_a_big_value_is_refused() {
    let (_rt, addr) = test_store();
    let mut c = StoreClient::connect(&addr, WAIT, None).unwrap();
    let err = c.set("big", &"x".repeat(MAX_VALUE + 1)).unwrap_err().to_string();
    assert!(err.contains("over"), "{err}");
    c.set("fits", &"x".repeat(MAX_VALUE - 100)).unwrap();
    assert_eq!(c.get("fits", WAIT).unwrap().len(), MAX_VALUE - 100);

    let (mut raw, _) = Raw::connect(&addr);
    assert_eq!(raw.auth(&auth::nonce(), b"").unwrap()["ok"], true);
    // No newline: the server stops reading at the limit and closes.
    let chunk = vec![b'a'; 64 << 10];
    let mut sent = 0;
    while sent < 2 * MAX_LINE {
        if raw.w.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert!(raw.closed());
    // The store still serves everyone else.
    c.set("after", "1").unwrap();
}

#[test]
fn verdict_abort_and_missing_keys_are_set_once() {
    let (_rt, addr) = test_store();
    let mut c = StoreClient::connect(&addr, WAIT, None).unwrap();
    for key in WRITE_ONCE {
        c.set(key, "first").unwrap();
        let err = c.set(key, "second").unwrap_err();
        assert!(matches!(&err, StoreError::AlreadySet(k) if k == key), "{err}");
        assert_eq!(c.get(key, WAIT).unwrap(), "first");
    }
    // Other keys may change.
    c.set("node/1", "a").unwrap();
    c.set("node/1", "b").unwrap();
    assert_eq!(c.get("node/1", WAIT).unwrap(), "b");
}

#[test]
fn a_thousand_ranks_register_meet_at_a_barrier_and_are_gathered() {
    // Both ends of every connection live in this process: room for 2 x 1024 descriptors.
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(hard >= 2200, "open-file limit {hard} is too low for this test");
    let (_rt, addr) = test_store();
    const N: usize = 1024;
    let started = Instant::now();
    let ranks: Vec<_> = (0..N)
        .map(|me| {
            let addr = addr.clone();
            std::thread::spawn(move || -> Result<(), StoreError> {
                let mut c = StoreClient::connect(&addr, Duration::from_secs(60), None)?;
                c.set(&format!("reg/{me}"), &format!("rank {me}"))?;
                c.barrier("all", me, N, Duration::from_secs(60))?;
                if me == 0 {
                    for k in 0..N {
                        assert_eq!(c.get(&format!("reg/{k}"), WAIT)?, format!("rank {k}"));
                    }
                }
                Ok(())
            })
        })
        .collect();
    let errors: Vec<String> = ranks
        .into_iter()
        .enumerate()
        .filter_map(|(k, r)| r.join().unwrap().err().map(|e| format!("{k}: {e}")))
        .collect();
    let odd: Vec<&String> = errors.iter().filter(|e| !e.contains("barrier/all/done")).collect();
    assert!(errors.is_empty(), "{} ranks failed: {:?} {odd:?}", errors.len(), &errors[..errors.len().min(3)]);
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn a_run_of_5000_ranks_holds_more_connections_and_keys_than_the_old_ceilings() {
    // Both ends of every connection live in this process.
    const N: usize = 5000;
    const KEYS_EACH: usize = 25;
    let nofile = super::limits::raise_nofile();
    assert!(nofile >= 2 * N as u64 + 200, "open-file limit {nofile} is too low for this test");
    let secret = Secret::random();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let listener = listen(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let bounds = Bounds::default();
        assert!(bounds.limits().connections < N, "the default bounds hold fewer: {:?}", bounds.limits());
        bounds.grow(Limits::for_run(N / 8, N));
        tokio::spawn(serve_within(listener, Some(secret.clone()), bounds));
        let mut set = tokio::task::JoinSet::new();
        for me in 0..N {
            let (addr, secret) = (addr.clone(), secret.clone());
            set.spawn(async move {
                let mut c = AsyncStoreClient::connect(&addr, Some(&secret)).await?;
                for k in 0..KEYS_EACH {
                    c.set(&format!("r/{me}/{k}"), "1").await?;
                }
                Ok::<_, StoreError>(c)
            });
        }
        let mut clients = Vec::new();
        while let Some(c) = set.join_next().await {
            clients.push(c.unwrap().unwrap());
        }
        // Every connection is still held: a barrier of all of them passes, and rank 0 reads a
        // key of every rank (more than 100,000 keys in the store).
        let mut set = tokio::task::JoinSet::new();
        for (me, mut c) in clients.into_iter().enumerate() {
            set.spawn(async move {
                c.barrier("all", me, N, Duration::from_secs(120)).await?;
                if me == 0 {
                    for r in 0..N {
                        c.get(&format!("r/{r}/{}", KEYS_EACH - 1), Duration::from_secs(5)).await?;
                    }
                }
                Ok::<_, StoreError>(c)
            });
        }
        let mut held = Vec::new();
        while let Some(c) = set.join_next().await {
            held.push(c.unwrap().unwrap());
        }
        assert_eq!(held.len(), N);
        // Hostile peers are still refused beside them: a wrong secret, and a peer that never
        // answers the challenge holds no key.
        let wrong = Secret::random();
        match AsyncStoreClient::connect(&addr, Some(&wrong)).await {
            Err(StoreError::Auth { why, .. }) => assert!(why.contains("secret"), "{why}"),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("a peer without the run's secret was served"),
        }
        match AsyncStoreClient::connect(&addr, None).await {
            Err(StoreError::Auth { .. }) => {}
            other => panic!("a peer without a secret: {:?}", other.err()),
        }
    });
}

#[test]
fn many_keys_come_back_in_order_in_batches_and_by_bytes() {
    let (rt, addr) = test_store();
    let mut c = StoreClient::connect(&addr, WAIT, None).unwrap();
    // More keys than one batch holds, and values whose sum passes one reply's bytes.
    let n = MAX_BATCH + 100;
    let big = |k: usize| k.is_multiple_of(1000);
    let value = |k: usize| if big(k) { "b".repeat(MAX_VALUE / 2) } else { format!("v{k}") };
    let keys: Vec<String> = (0..n).map(|k| format!("fig/{k}")).collect();
    // The last key arrives while rank 0 already waits.
    for (k, key) in keys.iter().enumerate().take(n - 1) {
        c.set(key, &value(k)).unwrap();
    }
    let (addr2, last) = (addr.clone(), keys[n - 1].clone());
    let setter = std::thread::spawn(move || {
        let mut b = StoreClient::connect(&addr2, WAIT, None).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        b.set(&last, "late").unwrap();
    });
    let got = c.get_many(&keys, WAIT).unwrap();
    setter.join().unwrap();
    assert_eq!(got.len(), n);
    for (k, v) in got.iter().enumerate().take(n - 1) {
        assert_eq!(*v, value(k), "key {k}");
    }
    assert_eq!(got[n - 1], "late");
    // The async client reads the same.
    let again = rt.block_on(async {
        let mut a = AsyncStoreClient::connect(&addr, None).await?;
        a.get_many(&keys, WAIT).await
    });
    assert_eq!(again.unwrap(), got);
    // A key never set: a timeout that names it.
    let missing = vec![keys[0].clone(), "never".to_string()];
    let err = c.get_many(&missing, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(&err, StoreError::Timeout(_, k) if k == "never"), "{err}");
}

#[test]
fn an_oversized_or_malformed_batch_is_refused_and_the_connection_still_serves() {
    let (_rt, addr) = test_store();
    let mut c = StoreClient::connect(&addr, WAIT, None).unwrap();
    c.set("k", "v").unwrap();
    let (mut raw, _) = Raw::connect(&addr);
    assert_eq!(raw.auth(&auth::nonce(), b"").unwrap()["ok"], true);
    let ask = |raw: &mut Raw, keys: Vec<String>| -> serde_json::Value {
        raw.send(&serde_json::json!({"op": "getmany", "keys": keys, "timeout_ms": 100}).to_string());
        serde_json::from_str(&raw.line().unwrap()).unwrap()
    };
    let r = ask(&mut raw, vec!["k".to_string(); MAX_BATCH + 1]);
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains(&format!("a batch of {} keys, over {MAX_BATCH}", MAX_BATCH + 1)));
    let r = ask(&mut raw, vec!["k".to_string(), "x".repeat(MAX_KEY + 1)]);
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains(&format!("over {MAX_KEY}")), "{r}");
    // A batch that is not a list of keys.
    raw.send(r#"{"op":"getmany","keys":"k","timeout_ms":100}"#);
    let r: serde_json::Value = serde_json::from_str(&raw.line().unwrap()).unwrap();
    assert!(r["error"].as_str().unwrap().starts_with("bad request"), "{r}");
    // The same connection still serves a batch within the bounds.
    let r = ask(&mut raw, vec!["k".to_string(), "k".to_string()]);
    assert_eq!(r["values"], serde_json::json!(["v", "v"]));
}

#[test]
fn tagged_requests_are_served_beside_each_other_and_answered_by_id() {
    let (_rt, addr) = test_store();
    let (mut raw, _) = Raw::connect(&addr);
    assert_eq!(raw.auth(&auth::nonce(), b"").unwrap()["ok"], true);
    let reply = |raw: &mut Raw| serde_json::from_str::<serde_json::Value>(&raw.line().unwrap()).unwrap();
    // A wait first, then on the same connection the set that ends it: the set is answered
    // while the wait is still in flight, then the wait, each under its own id.
    raw.send(r#"{"op":"tagged","id":7,"req":{"op":"get","key":"k","timeout_ms":5000}}"#);
    raw.send(r#"{"op":"tagged","id":8,"req":{"op":"set","key":"k","value":"v"}}"#);
    let first = reply(&mut raw);
    assert_eq!((first["id"].as_u64(), first["ok"].as_bool()), (Some(8), Some(true)), "{first}");
    let second = reply(&mut raw);
    assert_eq!((second["id"].as_u64(), second["value"].as_str()), (Some(7), Some("v")), "{second}");
    // An untagged request on the same connection is answered without an id.
    raw.send(r#"{"op":"get","key":"k","timeout_ms":10}"#);
    let plain = reply(&mut raw);
    assert!(plain.get("id").is_none() && plain["value"] == "v", "{plain}");
    // A tagged handshake, a tag within a tag, a relayed key on a store that relays nothing and
    // a batch mixing relayed keys with others: each refused, the connection still served.
    for (id, inner, why) in [
        (1, r#"{"op":"auth","nonce":"00","proof":""}"#, "tagged request holds"),
        (2, r#"{"op":"tagged","id":3,"req":{"op":"get","key":"k","timeout_ms":1}}"#, "tagged request holds"),
        (4, r#"{"op":"get","key":"relay/k","timeout_ms":1}"#, "relays nothing"),
        (5, r#"{"op":"getmany","keys":["relay/k","k"],"timeout_ms":1}"#, "mixing"),
    ] {
        raw.send(&format!(r#"{{"op":"tagged","id":{id},"req":{inner}}}"#));
        let r = reply(&mut raw);
        assert_eq!((r["id"].as_u64(), r["ok"].as_bool()), (Some(id), Some(false)), "{r}");
        assert!(r["error"].as_str().unwrap_or_default().contains(why), "{r}");
    }
    raw.send(r#"{"op":"tagged","id":"x","req":{"op":"get","key":"k","timeout_ms":1}}"#);
    assert!(reply(&mut raw)["error"].as_str().unwrap_or_default().contains("bad request"));
    raw.send(r#"{"op":"tagged","id":9,"req":{"op":"get","key":"k","timeout_ms":10}}"#);
    assert_eq!(reply(&mut raw)["id"].as_u64(), Some(9));
}
