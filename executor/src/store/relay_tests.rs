//! A node store's relay to node 0's store, against real servers.

use std::time::{Duration, Instant};

use super::*;

const WAIT: Duration = Duration::from_secs(10);

/// Node 0's store holding at most `connections` connections at once, on a runtime of its own.
fn node0(secret: &Secret, connections: usize) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(async { listen(([127, 0, 0, 1], 0).into()) }).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let bounds = Bounds::new(Limits { connections, ..Limits::default() });
    rt.spawn(serve_within(listener, Some(secret.clone()), bounds));
    (rt, addr)
}

#[test]
fn eight_ranks_reach_node_0_through_one_connection_of_their_node_store() {
    let secret = Secret::random();
    // Node 0 serves two connections at most: the relay's, and this test's own below. A rank
    // that went to node 0 directly would wait for a slot that never frees.
    let (rt, addr) = node0(&secret, 2);
    let store = {
        let _g = rt.enter();
        NodeStore::start(Some(secret.clone()), 8, &addr).unwrap()
    };
    let threads: Vec<_> = (0..8)
        .map(|rank| {
            let (node, secret) = (store.addr().to_string(), secret.clone());
            std::thread::spawn(move || {
                let mut c = StoreClient::connect(&node, WAIT, Some(secret)).unwrap().through_relay();
                c.set(&format!("addr/{rank}"), &format!("a{rank}")).unwrap();
                // Every rank waits for the next one's key at once: eight waits in flight
                // over the one connection.
                let next = c.get(&format!("addr/{}", (rank + 1) % 8), WAIT).unwrap();
                let all: Vec<String> = (0..8).map(|r| format!("addr/{r}")).collect();
                (next, c.get_many(&all, WAIT).unwrap())
            })
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let (next, all) = t.join().unwrap();
        assert_eq!(next, format!("a{}", (rank + 1) % 8));
        assert_eq!(all, (0..8).map(|r| format!("a{r}")).collect::<Vec<_>>());
    }
    // The keys are node 0's, under their own names.
    let mut direct = StoreClient::connect(&addr, WAIT, Some(secret.clone())).unwrap();
    assert_eq!(direct.get("addr/3", WAIT).unwrap(), "a3");
    // A key set at node 0 is read through the relay, a namespace included.
    direct.set("ns/from-node-0", "x").unwrap();
    let mut c = StoreClient::connect(store.addr(), WAIT, Some(secret.clone())).unwrap().through_relay();
    c.set_namespace("ns/");
    assert_eq!(c.get("from-node-0", WAIT).unwrap(), "x");
    // Without the relay's prefix a key stays in the node store.
    let mut local = StoreClient::connect(store.addr(), WAIT, Some(secret.clone())).unwrap();
    local.set("mine", "1").unwrap();
    assert!(matches!(direct.get("mine", Duration::from_millis(50)), Err(StoreError::Timeout(..))));
}

#[test]
fn a_wait_through_the_relay_times_out_as_a_direct_one_and_a_gone_node_0_is_an_error() {
    let secret = Secret::random();
    let (rt, addr) = node0(&secret, 16);
    let store = {
        let _g = rt.enter();
        // The node store on a runtime of its own, so that node 0's can go away alone.
        let own = tokio::runtime::Runtime::new().unwrap();
        let s = own.block_on(async { NodeStore::start(Some(secret.clone()), 2, &addr) }).unwrap();
        (own, s)
    };
    let mut c = StoreClient::connect(store.1.addr(), WAIT, Some(secret.clone())).unwrap().through_relay();
    let start = Instant::now();
    match c.get("never", Duration::from_millis(300)) {
        Err(StoreError::Timeout(_, key)) => assert_eq!(key, "never"),
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    c.set("k", "v").unwrap();
    // Node 0 goes away: a wait in flight ends with an error at once, not at its deadline, and
    // so does the next request.
    let waiter = {
        let (node, secret) = (store.1.addr().to_string(), secret.clone());
        std::thread::spawn(move || {
            let mut c = StoreClient::connect(&node, WAIT, Some(secret)).unwrap().through_relay();
            let start = Instant::now();
            (c.get("later", Duration::from_secs(60)).map_err(|e| e.to_string()), start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    rt.shutdown_timeout(Duration::from_secs(1));
    let (got, took) = waiter.join().unwrap();
    let e = got.unwrap_err();
    assert!(e.contains("node 0"), "{e}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let e = c.get("k", WAIT).unwrap_err().to_string();
    assert!(e.contains("node 0"), "{e}");
}

#[test]
fn a_relay_refuses_node_0_without_the_runs_secret() {
    let (rt, addr) = node0(&Secret::random(), 4);
    let secret = Secret::random();
    let store = {
        let _g = rt.enter();
        NodeStore::start(Some(secret.clone()), 2, &addr).unwrap()
    };
    let mut c = StoreClient::connect(store.addr(), WAIT, Some(secret)).unwrap().through_relay();
    let e = c.set("k", "v").unwrap_err().to_string();
    assert!(e.contains("secret"), "{e}");
}
