//! The two-level rounds against real servers: node 0's store and one store per node.

use std::time::{Duration, Instant};

use super::*;

const WAIT: Duration = Duration::from_secs(10);

/// Whether `key` is set in the store at `addr` (a short wait, then absent).
fn has(addr: &str, key: &str, secret: &Secret) -> bool {
    let mut c = StoreClient::connect(addr, WAIT, Some(secret.clone())).unwrap();
    match c.get(key, Duration::from_millis(30)) {
        Ok(_) => true,
        Err(StoreError::Timeout(..)) => false,
        Err(e) => panic!("{e}"),
    }
}

/// Runs `f` on every rank of nodes of `sizes`, each in a thread of its own, with node stores
/// at `node_addrs` (by node), and returns what each rank returned, by rank.
fn world<T: Send + 'static>(
    sizes: &[usize],
    addr: &str,
    node_addrs: &[Option<String>],
    secret: &Secret,
    skip: Option<usize>,
    f: impl Fn(&mut Rounds) -> T + Send + Sync + Clone + 'static,
) -> Vec<Option<T>> {
    let mut threads = Vec::new();
    let mut rank = 0;
    for (node, &n) in sizes.iter().enumerate() {
        for local in 0..n {
            let me = Member { rank, node_rank: node, local_rank: local, node_sizes: sizes.to_vec() };
            let (addr, node_addr, secret, f) = (addr.to_string(), node_addrs[node].clone(), secret.clone(), f.clone());
            let skipped = skip == Some(rank);
            threads.push(std::thread::spawn(move || {
                if skipped {
                    return None;
                }
                // As a worker does: node 0's keys through the node store's relay where there is one.
                let c = |a: &str| StoreClient::connect(a, WAIT, Some(secret.clone())).unwrap();
                let w = match &node_addr {
                    Some(a) => c(a).through_relay(),
                    None => c(&addr),
                };
                let n = node_addr.map(|a| c(&a));
                let mut r = Rounds::new(w, n, me).unwrap();
                Some(f(&mut r))
            }));
            rank += 1;
        }
    }
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Node 0's store and two node stores for `ranks` ranks each, all with one fresh secret: the
/// runtime serving them, node 0's address, the secret, the node stores and their addresses.
fn two_nodes(ranks: usize) -> (tokio::runtime::Runtime, String, Secret, Vec<NodeStore>, Vec<Option<String>>) {
    let secret = Secret::random();
    let (rt, addr) = test_store_with(Some(secret.clone()));
    let stores: Vec<NodeStore> = {
        let _g = rt.enter();
        (0..2).map(|_| NodeStore::start(Some(secret.clone()), ranks, &addr).unwrap()).collect()
    };
    let node_addrs = stores.iter().map(|s| Some(s.addr().to_string())).collect();
    (rt, addr, secret, stores, node_addrs)
}

/// A barrier, a gather and a broadcast of every rank.
fn one_of_each(r: &mut Rounds) -> (Option<Vec<String>>, String) {
    r.barrier_all("b", WAIT).unwrap();
    let rank = r.rank();
    let all = r.gather("g", &format!("v{rank}"), WAIT).unwrap();
    let v = r.broadcast("d", (rank == 0).then_some("decided"), WAIT).unwrap();
    (all, v)
}

#[test]
fn node_0_sees_one_voice_per_node_and_the_node_stores_the_rest() {
    let (_rt, addr, secret, stores, node_addrs) = two_nodes(4);
    let out = world(&[4, 4], &addr, &node_addrs, &secret, None, one_of_each);
    let want: Vec<String> = (0..8).map(|r| format!("v{r}")).collect();
    for (rank, o) in out.into_iter().enumerate() {
        let (all, v) = o.unwrap();
        assert_eq!(v, "decided", "rank {rank}");
        assert_eq!(all, (rank == 0).then(|| want.clone()), "rank {rank}");
    }
    // Node 0's store: the nodes' barrier key, no rank's; one gathered value per node.
    for r in 0..8 {
        assert!(!has(&addr, &format!("barrier/b/{r}"), &secret), "a per-rank barrier key of rank {r}");
    }
    assert!(has(&addr, "barrier/b/nodes/1", &secret));
    assert!(has(&addr, "barrier/b/nodes/done", &secret));
    assert!(has(&addr, "gather/g/nodes/1", &secret));
    assert!(has(&addr, "bcast/d", &secret));
    for (node, store) in stores.iter().enumerate() {
        for l in 1..4 {
            assert!(!has(&addr, &format!("barrier/local/{node}/b/{l}"), &secret), "node {node} rank {l} in node 0");
            assert!(!has(&addr, &format!("local/{node}/gather/g/{l}"), &secret));
        }
        // ... they are in the node's own store.
        let na = store.addr();
        assert!(has(na, &format!("barrier/local/{node}/b/3"), &secret));
        assert!(has(na, &format!("local/{node}/gather/g/3"), &secret));
        assert!(has(na, &format!("local/{node}/bcast/d"), &secret));
    }
    let node1 = format!("[{}]", (4..8).map(|r| format!("\"v{r}\"")).collect::<Vec<_>>().join(","));
    let mut c = StoreClient::connect(&addr, WAIT, Some(secret.clone())).unwrap();
    assert_eq!(c.get("gather/g/nodes/1", WAIT).unwrap(), node1);
}

#[test]
fn without_node_stores_and_with_uneven_nodes_the_rounds_still_meet() {
    let secret = Secret::random();
    let (_rt, addr) = test_store_with(Some(secret.clone()));
    let sizes = [3, 1, 0, 2];
    let out = world(&sizes, &addr, &[None, None, None, None], &secret, None, one_of_each);
    let want: Vec<String> = (0..6).map(|r| format!("v{r}")).collect();
    assert_eq!(out[0].as_ref().unwrap().0.as_ref(), Some(&want));
    assert!(out.iter().all(|o| o.as_ref().unwrap().1 == "decided"));
}

#[test]
fn a_rank_that_never_arrives_ends_every_round_with_a_timeout() {
    let (_rt, addr, secret, _stores, node_addrs) = two_nodes(3);
    let short = Duration::from_millis(600);
    let started = Instant::now();
    // Rank 4, on node 1 but not its leader, never comes.
    let out = world(&[3, 3], &addr, &node_addrs, &secret, Some(4), move |r| {
        let b = r.barrier_all("b", short).map_err(|e| e.to_string());
        let g = r.gather("g", "x", short).map(|v| v.map(|v| v.len())).map_err(|e| e.to_string());
        (b, g)
    });
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    for (rank, o) in out.into_iter().enumerate() {
        let Some((b, g)) = o else {
            assert_eq!(rank, 4);
            continue;
        };
        let e = b.unwrap_err();
        assert!(e.contains("timed out"), "rank {rank}: {e}");
        // Only the leaders wait in a gather: node 1's for rank 4, rank 0 for node 1.
        match rank {
            0 | 3 => assert!(g.unwrap_err().contains("timed out"), "rank {rank}"),
            _ => assert_eq!(g, Ok(None), "rank {rank}"),
        }
    }
}

#[test]
fn namespaces_apply_to_both_stores_and_a_bad_place_is_refused() {
    let secret = Secret::random();
    let (rt, addr) = test_store_with(Some(secret.clone()));
    let store = {
        let _g = rt.enter();
        NodeStore::start(Some(secret.clone()), 2, &addr).unwrap()
    };
    let out = world(&[2], &addr, &[Some(store.addr().to_string())], &secret, None, |r| {
        r.set_namespace("again/");
        r.barrier_all("b", WAIT).unwrap();
    });
    assert_eq!(out.len(), 2);
    assert!(has(store.addr(), "again/barrier/local/0/b/1", &secret));
    assert!(has(&addr, "again/barrier/b/nodes/done", &secret));
    assert!(!has(store.addr(), "barrier/local/0/b/1", &secret));

    let c = || StoreClient::connect(&addr, WAIT, Some(secret.clone())).unwrap();
    let bad = Member { rank: 1, node_rank: 1, local_rank: 0, node_sizes: vec![2, 2] };
    assert!(Rounds::new(c(), None, bad).is_err(), "rank 1 is not node 1's first");
    let bad = Member { rank: 0, node_rank: 2, local_rank: 0, node_sizes: vec![2, 2] };
    assert!(Rounds::new(c(), None, bad).is_err(), "no node 2");
    let bad = Member { rank: 2, node_rank: 0, local_rank: 2, node_sizes: vec![2, 2] };
    assert!(Rounds::new(c(), None, bad).is_err(), "local rank beyond its node");
}

#[test]
fn a_node_whose_values_do_not_fit_in_one_value_gives_them_rank_by_rank() {
    let (_rt, addr, secret, _stores, node_addrs) = two_nodes(4);
    // Four values of 300 KB: 1.2 MB for node 1, over the store's 1 MiB.
    let big = |rank: usize| format!("{rank}{}", "x".repeat(300_000));
    let out = world(&[4, 4], &addr, &node_addrs, &secret, None, move |r| {
        let rank = r.rank();
        r.gather("big", &big(rank), WAIT).unwrap()
    });
    let all = out[0].clone().unwrap().unwrap();
    assert_eq!(all.len(), 8);
    for (rank, v) in all.iter().enumerate() {
        assert_eq!(v, &big(rank), "rank {rank}");
    }
    assert!(has(&addr, "gather/big/ranks/5", &secret));
    assert!(!has(&addr, "gather/big/ranks/1", &secret), "node 0's own values never leave it");
}
