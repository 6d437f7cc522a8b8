//! The control plane of a run of N ranks, simulated (docs/benchmarks/scale.md): node 0's real
//! store server and real launcher code (`Cluster::join`, `gather`, `build_report` with the
//! diagnosis, report.json, the HTML page, the verdict) in one process, and in another the
//! other nodes' launchers and every rank as async clients speaking the real, authenticated
//! protocol: the rendezvous, the barriers and figure exchanges of the default check (gemm,
//! all-reduce, network-connectivity), the outcomes, the verdict. No check runs: the ranks'
//! results are synthetic (H200-like figures with a little noise).
//!
//! The world-wide rounds are two-level, as the workers run them (`store::Rounds`): a node's
//! ranks meet in their node's own store, and its local rank 0 speaks for them in node 0's. Here
//! node 0's own ranks run the real `Rounds` against a real node store; every other node is its
//! leader's async client doing the node-level steps in node 0's store (its node-local rounds
//! would run on its own node, in parallel with every other node's: run in this process they
//! would share these cores with node 0). The cost of one node's local rounds is printed apart
//! (`a node's own rounds`), measured on node 0's ranks alone.
//!
//! Prints per phase its wall time and node 0's peak RSS (VmHWM of node 0's process).
//!
//! Usage: scale_sim [RANKS...] (default 1024 4096 16384); GPUS_PER_NODE (default 8);
//! EMPTY_ROWS=1 (network-connectivity rows without probes, see [`row`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::expected::Conditions;
use gpusanity_common::peers::{self, PeerBands};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{DeviceKind, NodeInfo};
use gpusanity_common::wire::launcher::LauncherNotice;
use gpusanity_executor::launcher::node::{Cluster, Joined, Offer};
use gpusanity_executor::launcher::rendezvous::Topology;
use gpusanity_executor::launcher::{arrival, gather, write_report};
use gpusanity_executor::store::{
    broadcast_key, gather_key, nodes_barrier_key, AsyncStoreClient, Member, NodeStore, Ports, Rounds, Secret,
    StoreClient,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;

#[path = "sim_ranks.rs"]
mod sim_ranks;
use sim_ranks::{node_info, outcome, peak_rss_mib, CHECKS, DEVICE};

const SECRET: &[u8] = b"scale-sim-secret-0123456789abcdef";
const WAIT: Duration = Duration::from_secs(600);

fn main() -> Result<()> {
    let nofile = gpusanity_executor::store::limits::raise_nofile();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gpus: usize = std::env::var("GPUS_PER_NODE").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let rt = tokio::runtime::Runtime::new()?;
    if args.first().map(String::as_str) == Some("node0") {
        let ranks: usize = args.get(1).context("node0 RANKS")?.parse()?;
        return rt.block_on(node0(ranks, gpus));
    }
    let sizes: Vec<usize> = if args.is_empty() {
        vec![1024, 4096, 16384]
    } else {
        args.iter().map(|a| a.parse()).collect::<Result<_, _>>()?
    };
    println!("# {} cores, {gpus} ranks per node, checks gemm,all-reduce,network-connectivity", cores());
    for n in sizes {
        rt.block_on(run(n, gpus, nofile))?;
    }
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn secret() -> Result<Secret> {
    Ok(Secret::new(SECRET, "the simulator")?)
}

/// Node 0: the real launcher path, from hosting the store to the verdict's acknowledgements.
async fn node0(ranks: usize, gpus: usize) -> Result<()> {
    let nnodes = ranks.div_ceil(gpus);
    let topo = Topology {
        nnodes,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        listen: Ports::One(0),
        announce_port: true,
        source: "flags",
        node_names: Vec::new(),
    };
    let devices = vec![DEVICE.to_string(); gpus];
    let offer = Offer { device: DeviceKind::Cuda, nproc: gpus, devices, not_ready: Vec::new(), fault: None };
    let Joined::All(cluster) = Cluster::join(&topo, Some("node-0"), offer, WAIT, Some(secret()?)).await? else {
        bail!("not every node joined");
    };
    let (_abort_watch, _abort) = (cluster.connect_again().await?, cluster.connect_again().await?);
    let own = outcome(0, &cluster.nodes, gpus);
    let t = Instant::now();
    let outcomes = cluster.gather(own, WAIT).await;
    say("gather", t);
    let mut configs = CheckConfigs::defaults(DeviceKind::Cuda);
    configs.apply_params(&[])?;
    let meta = gather::RunMeta {
        run_id: cluster.run_id.clone(),
        started_at: chrono::Utc::now(),
        settings: Default::default(),
        backend: DeviceKind::Cuda,
        configs,
        checks: CHECKS.to_vec(),
    };
    let t = Instant::now();
    let report = gather::build_report(&meta, &cluster.nodes, &outcomes, None);
    say("diagnosis", t);
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let json = serde_json::to_vec_pretty(&report)?;
    std::fs::write(dir.path().join("report.json"), &json)?;
    say("report.json", t);
    let t = Instant::now();
    write_report(dir.path(), &report)?;
    let html = std::fs::metadata(dir.path().join("report.html")).map_or(0, |m| m.len());
    say("report.json+html", t);
    println!("size report.json {} html {} findings {}", json.len(), html, report.findings.len());
    let t = Instant::now();
    let end = gpusanity_executor::launcher::node::RunEnd {
        status: report.status,
        summary: report.summary.clone(),
        hold: false,
    };
    cluster.publish_verdict(&end).await;
    say("verdict", t);
    Ok(())
}

fn say(phase: &str, t: Instant) {
    println!("phase {phase} {:.3} {:.1}", t.elapsed().as_secs_f64(), peak_rss_mib("self"));
}

/// One run of `n` ranks: node 0 in a child process, everyone else here.
async fn run(n: usize, gpus: usize, nofile: u64) -> Result<()> {
    let nnodes = n.div_ceil(gpus);
    // Each process holds one end of every connection: the launchers' two abort connections
    // are left out where they would not fit under the open-file limit.
    let with_abort = (n + 3 * nnodes + 256) as u64 <= nofile;
    if !with_abort {
        println!("(open-file limit {nofile}: each launcher holds one connection, not three)");
    }
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(["node0", &n.to_string()])
        .env("GPUSANITY_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("node 0's pid")?.to_string();
    let mut lines = BufReader::new(child.stdout.take().context("node 0's stdout")?).lines();
    let port = loop {
        let line = lines.next_line().await?.context("node 0 ended before binding")?;
        if let Some(LauncherNotice::RendezvousBound { port }) = LauncherNotice::parse(&line) {
            break port;
        }
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let relay = tokio::spawn(async move {
        let mut out = Vec::new();
        while let Ok(Some(l)) = lines.next_line().await {
            out.push(l);
        }
        out
    });
    println!("\n## {n} ranks ({nnodes} nodes)");
    println!("{:<34} {:>9} {:>14}", "phase", "wall_s", "node0_peak_MiB");
    let phase = |name: &str, t: Instant| {
        println!("{name:<34} {:>9.3} {:>14.1}", t.elapsed().as_secs_f64(), peak_rss_mib(&pid));
    };
    let total = Instant::now();

    // The rendezvous: every other launcher registers (three connections each, as
    // `check` holds), then every other node's store opens its relay's one connection (the
    // node's ranks reach node 0 through it, store::relay).
    let t = Instant::now();
    let mut set = JoinSet::new();
    for k in 1..nnodes {
        set.spawn(async move { launcher(addr, k, nnodes, gpus, with_abort).await });
    }
    let mut launchers = Vec::new();
    while let Some(l) = set.join_next().await {
        launchers.push(l??);
    }
    phase("rendezvous (launchers)", t);
    let t = Instant::now();
    let s = secret()?;
    let mut set = JoinSet::new();
    for k in 1..nnodes {
        let s = s.clone();
        set.spawn(async move { connect(addr, node_ip(k), &s).await.map(|c| (k, c)) });
    }
    let mut clients: Vec<Option<AsyncStoreClient>> = (0..nnodes).map(|_| None).collect();
    while let Some(c) = set.join_next().await {
        let (k, c) = c??;
        clients[k] = Some(c);
    }
    phase("rendezvous (node relays connect)", t);

    // Node 0's own store and ranks, which run the real two-level rounds (store::Rounds),
    // reaching node 0's store through the node store's relay as workers do.
    let own_store = NodeStore::start(Some(s.clone()), gpus, &addr.to_string())?;
    let mut own = own_ranks(own_store.addr().to_string(), true, n, gpus, s.clone()).await?;
    // A node's own rounds, alone: the sequence of the checks below among node 0's ranks and its
    // store, as a world of one node (what every node does in parallel on a cluster).
    let t = Instant::now();
    let alone = own_ranks(own_store.addr().to_string(), false, gpus, gpus, s.clone()).await?;
    own_checks(alone, "alone/").await?;
    phase("a node's own rounds (alone)", t);

    // Each check: its barrier, and what its control plane does around it; node 0's ranks in
    // threads of their own, every other node's leader as an async client.
    for (i, check) in CHECKS.iter().enumerate() {
        let t = Instant::now();
        let mut set = JoinSet::new();
        for (k, slot) in clients.iter_mut().enumerate().skip(1) {
            let mut c = slot.take().context("client")?;
            let check = *check;
            set.spawn(async move {
                leader_check(&mut c, check, i, k, nnodes, gpus).await?;
                anyhow::Ok((k, c))
            });
        }
        let check = *check;
        let mut threads = JoinSet::new();
        for mut r in own.drain(..) {
            threads.spawn_blocking(move || {
                own_check(&mut r, check, i, nnodes)?;
                anyhow::Ok(r)
            });
        }
        while let Some(c) = set.join_next().await {
            let (k, c) = c??;
            clients[k] = Some(c);
        }
        while let Some(r) = threads.join_next().await {
            own.push(r??);
        }
        phase(&format!("barrier + {}", check.as_str()), t);
    }

    // The outcomes, node 0's gathering, diagnosis and report, the verdict.
    let t = Instant::now();
    let nodes: Vec<NodeInfo> = (0..nnodes).map(|k| node_info(k, gpus)).collect();
    let mut set = JoinSet::new();
    for (k, mut c) in launchers {
        let v = serde_json::to_string(&outcome(k, &nodes, gpus))?;
        set.spawn(async move {
            c.set(&format!("outcome/{k}"), &v).await?;
            c.get("verdict", WAIT).await?;
            c.set(&format!("ack/{k}"), "1").await?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    phase("outcomes to the verdict", t);
    let status = child.wait().await?;
    phase("total", total);
    for line in relay.await? {
        if let Some(rest) = line.strip_prefix("phase ") {
            let v: Vec<&str> = rest.split(' ').collect();
            if let [name, wall, rss] = v[..] {
                println!("  node 0: {name:<27} {wall:>9} {rss:>14}");
            }
        } else if line.starts_with("size ") {
            println!("  node 0: {line}");
        }
    }
    if !status.success() {
        bail!("node 0 exited with {status}");
    }
    Ok(())
}

/// The loopback address node `k` speaks from (127.0.0.1 is node 0's): as on a cluster, each
/// node's connections come from an address of its own (thousands from one address would
/// spend the run in the kernel's search for a free port).
fn node_ip(k: usize) -> IpAddr {
    let [_, a, b, c] = u32::try_from(k).unwrap_or(u32::MAX).to_be_bytes();
    Ipv4Addr::new(127, a.saturating_add(1), b, c).into()
}

/// Connects as a worker does: a handshake cut short (node 0 busy with thousands arriving at
/// once) is tried again until [`WAIT`]; a refusal is final.
async fn connect(addr: SocketAddr, from: IpAddr, s: &Secret) -> Result<AsyncStoreClient> {
    Ok(AsyncStoreClient::retrying(WAIT, || AsyncStoreClient::connect_from(addr, from, Some(s))).await?)
}

/// Node `k`'s launcher up to the start of its workers: registers, reads node 0's
/// roster (as `arrival::wait_all` does), holds the two connections of the abort watch.
async fn launcher(
    addr: SocketAddr,
    k: usize,
    nnodes: usize,
    gpus: usize,
    with_abort: bool,
) -> Result<(usize, AsyncStoreClient)> {
    let s = secret()?;
    let mut c = connect(addr, node_ip(k), &s).await?;
    let reg = serde_json::json!({
        "info": node_info(k, gpus),
        "device": DeviceKind::Cuda,
        "devices": vec![DEVICE; gpus],
    });
    c.set(&format!("node/{k}"), &reg.to_string()).await?;
    c.get("run_id", WAIT).await?;
    // As `arrival::wait_all` does: node 0's roster, in pieces.
    let count = c.get(arrival::LIST_KEY, WAIT).await?;
    let pieces = c.get_many(&arrival::piece_keys(&count)?, WAIT).await?;
    let roster = arrival::Roster::from_pieces(&pieces, nnodes)?;
    if roster.sizes.iter().sum::<usize>() != nnodes * gpus {
        bail!("node 0's roster holds {} ranks of {}", roster.sizes.iter().sum::<usize>(), nnodes * gpus);
    }
    if !with_abort {
        return Ok((k, c));
    }
    let mut watch = connect(addr, node_ip(k), &s).await?;
    let abort = connect(addr, node_ip(k), &s).await?;
    tokio::spawn(async move {
        let _ = watch.get("abort", WAIT).await;
        drop(abort);
    });
    Ok((k, c))
}

/// Node 0's ranks with their real rounds, two clients each, for a world of `n`, on the node store at `node`; with `relay`, node 0's keys go
/// through the node store's relay, else to the node store itself (a world of one node).
async fn own_ranks(node: String, relay: bool, n: usize, gpus: usize, s: Secret) -> Result<Vec<Rounds>> {
    tokio::task::spawn_blocking(move || {
        (0..gpus.min(n))
            .map(|rank| {
                let w = StoreClient::connect(&node, WAIT, Some(s.clone()))?;
                let w = if relay { w.through_relay() } else { w };
                let c = StoreClient::connect(&node, WAIT, Some(s.clone()))?;
                let sizes: Vec<usize> = (0..n.div_ceil(gpus)).map(|k| gpus.min(n - k * gpus)).collect();
                let me = Member { rank, node_rank: 0, local_rank: rank, node_sizes: sizes };
                Ok(Rounds::new(w, Some(c), me)?)
            })
            .collect()
    })
    .await?
}

/// The checks' rounds of `own` (node 0's ranks) alone, under namespace `ns`.
async fn own_checks(own: Vec<Rounds>, ns: &'static str) -> Result<Vec<Rounds>> {
    let mut threads = JoinSet::new();
    for mut r in own {
        threads.spawn_blocking(move || {
            r.set_namespace(ns);
            for (i, check) in CHECKS.iter().enumerate() {
                own_check(&mut r, *check, i, 1)?;
            }
            r.set_namespace("");
            anyhow::Ok(r)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = threads.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

/// What a rank of node 0 does with the store in check `i`, as a worker does (worker/mod.rs and
/// the checks): the real two-level rounds.
fn own_check(r: &mut Rounds, check: CheckId, i: usize, nnodes: usize) -> Result<()> {
    let rank = r.rank();
    r.barrier_all(&format!("check/{i}"), WAIT)?;
    match check {
        CheckId::Gemm => {
            r.barrier_all("gemm/timed", WAIT)?;
            own_exchange(r, check, rank)
        }
        CheckId::AllReduce => own_exchange(r, check, rank),
        _ => {
            if rank == 0 {
                r.set("net/front/0", "10.0.0.1:40000")?;
                r.barrier("net/front/up", 0, nnodes, WAIT)?;
            }
            r.barrier_all("net/front/done", WAIT)?;
            r.gather("net/row", &row(rank, nnodes), WAIT)?;
            r.barrier_all("net/done", WAIT)?;
            Ok(())
        }
    }
}

/// The re-measure's figure exchange (executor/src/checks/remeasure.rs) of a rank of node 0:
/// every figure to rank 0, which judges them with the real judging, and its decision back.
fn own_exchange(r: &mut Rounds, check: CheckId, rank: usize) -> Result<()> {
    let decision = match r.gather(&format!("diag/{check}"), &figure(rank), WAIT)? {
        Some(all) => {
            let mut figures = Vec::with_capacity(all.len());
            for (r, v) in all.iter().enumerate() {
                let v: serde_json::Value = serde_json::from_str(v)?;
                figures.push((r, DEVICE.to_string(), v["value"].as_f64().unwrap_or(0.0)));
            }
            let metric = check.metric().context("a check with a headline figure")?;
            let bands = PeerBands::new(0.5, false);
            let slow = peers::critical_ranks(check, metric.key, &figures, bands, Conditions::default());
            let ranks: Vec<usize> = slow.iter().map(|c| c.rank).collect();
            Some(serde_json::to_string(&ranks)?)
        }
        None => None,
    };
    r.broadcast(&format!("diag/{check}/slow"), decision.as_deref(), WAIT)?;
    Ok(())
}

/// What node `k`'s leader (its local rank 0) does in node 0's store in check `i`, once its
/// node's ranks have met in their node store: the node-level steps of `store::Rounds`.
async fn leader_check(
    c: &mut AsyncStoreClient,
    check: CheckId,
    i: usize,
    k: usize,
    nnodes: usize,
    gpus: usize,
) -> Result<()> {
    nodes_barrier(c, &format!("check/{i}"), k).await?;
    match check {
        CheckId::Gemm => {
            nodes_barrier(c, "gemm/timed", k).await?;
            leader_exchange(c, check, k, gpus).await
        }
        CheckId::AllReduce => leader_exchange(c, check, k, gpus).await,
        _ => {
            c.set(&format!("net/front/{k}"), "10.0.0.1:40000").await?;
            c.barrier("net/front/up", k, nnodes, WAIT).await?;
            nodes_barrier(c, "net/front/done", k).await?;
            let rows: Vec<String> = (k * gpus..(k + 1) * gpus).map(|r| row(r, nnodes)).collect();
            c.set(&gather_key("net/row", k), &serde_json::to_string(&rows)?).await?;
            nodes_barrier(c, "net/done", k).await
        }
    }
}

/// A node's leader at world-wide barrier `name` in node 0's store.
async fn nodes_barrier(c: &mut AsyncStoreClient, name: &str, k: usize) -> Result<()> {
    c.set(&nodes_barrier_key(name, Some(k)), "1").await?;
    c.get(&nodes_barrier_key(name, None), WAIT).await?;
    Ok(())
}

/// Node `k`'s leader in the figure exchange: its ranks' figures as one value, the decision back.
async fn leader_exchange(c: &mut AsyncStoreClient, check: CheckId, k: usize, gpus: usize) -> Result<()> {
    let figures: Vec<String> = (k * gpus..(k + 1) * gpus).map(figure).collect();
    c.set(&gather_key(&format!("diag/{check}"), k), &serde_json::to_string(&figures)?).await?;
    c.get(&broadcast_key(&format!("diag/{check}/slow")), WAIT).await?;
    Ok(())
}

/// Rank `rank`'s figure as the re-measure publishes it.
fn figure(rank: usize) -> String {
    serde_json::json!({"device": DEVICE, "value": 686.0 + (rank % 7) as f64}).to_string()
}

/// Rank `rank`'s row of network-connectivity probes: its 2·log2(nodes) back-end partners (and
/// as many front-end probes on a node's first rank), as the probe plan gives beyond the full
/// matrix. `EMPTY_ROWS=1`: rows without probes, as the simulator sent before the two-level
/// rounds (to compare like with like).
fn row(rank: usize, nnodes: usize) -> String {
    let empty = std::env::var("EMPTY_ROWS").is_ok_and(|v| v == "1");
    let partners = if empty { 0 } else { 2 * nnodes.max(2).next_power_of_two().trailing_zeros() as usize };
    let probe =
        |from: usize, i: usize| serde_json::json!({"from": from, "to": from + i + 1, "ms": 0.051234, "error": null});
    let back: Vec<serde_json::Value> = (0..partners).map(|i| probe(rank, i)).collect();
    let front: Vec<serde_json::Value> =
        if rank.is_multiple_of(8) { (0..partners).map(|i| probe(rank / 8, i)).collect() } else { Vec::new() };
    serde_json::json!({"front": front, "back": back}).to_string()
}
