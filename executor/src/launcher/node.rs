//! The launchers' side of the rendezvous: node 0 hosts the store; every node registers, learns
//! its ranks, posts its outcome and receives the verdict through it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use gpusanity_common::report::{DeviceKind, Finding, NodeInfo, RunStatus};
use gpusanity_common::wire::launcher::LauncherNotice;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::arrival::{self, Arrival, Roster};
use super::outcome::{Heard, NodeOutcome, Stop};
use super::rendezvous::Topology;
use super::UsageError;
use crate::store::{self, Secret, StoreClient, StoreError, ABORT_KEY, VERDICT_KEY};

/// How the run ended, as node 0 tells every node to act on it (the report's status and
/// summary; the verdict itself is the report's, see `gpusanity_common::verdict`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEnd {
    pub status: RunStatus,
    pub summary: String,
    /// A timeout under KeepJobHang: stay in Checking.
    pub hold: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Registration {
    info: NodeInfo,
    device: DeviceKind,
    devices: Vec<String>,
    /// Why this node cannot run the job's GPUs (readiness.rs); empty on a ready node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    not_ready: Vec<Finding>,
    /// The test fault of this launcher's own environment, with `--test-faults`: its workers
    /// inject it, so node 0's report must say the run was not a clean one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
}

/// The longest test fault a node's registration may name (more is cut at a character).
const MAX_FAULT_BYTES: usize = 256;

/// A node's test fault as node 0 records it: at most [`MAX_FAULT_BYTES`], cut at a character.
fn bounded(fault: &str) -> String {
    let mut end = fault.len().min(MAX_FAULT_BYTES);
    while !fault.is_char_boundary(end) {
        end -= 1;
    }
    fault[..end].to_string()
}

/// What this node brings to the rendezvous: its backend and devices, or why it cannot run the
/// job (then no check runs anywhere and node 0 names it with its evidence).
pub struct Offer {
    pub device: DeviceKind,
    pub nproc: usize,
    pub devices: Vec<String>,
    pub not_ready: Vec<Finding>,
    /// The test fault this node's workers inject from the launcher's own environment.
    pub fault: Option<String>,
}

pub struct AbortHandle(StoreClient);

impl AbortHandle {
    pub fn publish(&mut self, stop: &Stop) {
        let res = serde_json::to_string(stop)
            .map_err(|e| StoreError::Protocol(e.to_string()))
            .and_then(|v| self.0.set(ABORT_KEY, &v));
        match res {
            Ok(()) => {}
            // Another node stopped first and told everyone: its word stands.
            Err(StoreError::AlreadySet(_)) => tracing::info!("another node had already told the nodes to stop"),
            Err(e) => tracing::warn!("could not tell the other nodes to stop: {e}"),
        }
    }
}

pub struct Cluster {
    client: Arc<Mutex<StoreClient>>,
    pub store_addr: String,
    /// The run's rendezvous secret, which the workers get too.
    pub secret: Option<Secret>,
    pub node_rank: usize,
    pub node_addr: String,
    pub hostname: String,
    /// Every node, on node 0 (which alone reports); empty on the others, which need only
    /// `sizes` (arrival.rs's roster).
    pub nodes: Vec<NodeInfo>,
    /// Each node's ranks, by node rank.
    pub sizes: Vec<usize>,
    /// The nodes whose workers inject a test fault of their launcher's own environment, and
    /// the fault (on node 0; empty on the others).
    pub faults: Vec<(usize, String)>,
    pub world: usize,
    pub rank_offset: usize,
    pub run_id: String,
    /// Node 0's store's bounds (on node 0 only).
    store_bounds: Option<store::Bounds>,
}

/// The end of the rendezvous.
pub enum Joined {
    All(Cluster),
    /// Some nodes never arrived within the wait.
    Missing(MissingNodes),
    /// Every node arrived, but some cannot run the job's GPUs: their findings (bounded and
    /// placed on the node that sent them, `sent::accepted`; on node 0 only) and node 0's
    /// summary of them.
    NotReady(Cluster, Vec<Finding>, String),
}

/// The nodes of a run some of which never arrived at the rendezvous.
pub struct MissingNodes {
    /// Every node by rank; a missing one with what is known of it (its rank).
    pub nodes: Vec<NodeInfo>,
    /// The node ranks that never arrived.
    pub missing: Vec<usize>,
    /// How long node 0 waited for them.
    pub waited: Duration,
    pub run_id: String,
    /// The findings of the nodes that arrived but cannot run the job's GPUs.
    pub not_ready: Vec<Finding>,
}

/// Runs a blocking store call off the async runtime.
async fn blocking<T: Send + 'static>(
    client: &Arc<Mutex<StoreClient>>,
    f: impl FnOnce(&mut StoreClient) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let client = client.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = client.lock().map_err(|_| StoreError::Protocol("store client poisoned".into()))?;
        f(&mut c)
    })
    .await
    .map_err(|e| StoreError::Protocol(e.to_string()))?
}

impl Cluster {
    pub async fn join(
        topo: &Topology,
        name: Option<&str>,
        offer: Offer,
        timeout: Duration,
        secret: Option<Secret>,
    ) -> Result<Joined> {
        // Node 0's store, sized for its nodes now and for their ranks once they have said.
        let bounds = store::Bounds::new(store::Limits::for_run(
            topo.nnodes,
            topo.nnodes.saturating_mul(store::limits::ASSUMED_RANKS_PER_NODE),
        ));
        let store_addr = store_address(topo, &secret, &bounds).await?;
        let (client, node_addr) = connect(&store_addr, timeout, secret.clone()).await?;
        let hostname = match name {
            Some(n) => n.to_string(),
            None => {
                nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| node_addr.clone())
            }
        };
        let device = offer.device;
        let me = Registration::of(topo.node_rank, &hostname, &node_addr, offer);
        let (run_id, arrival) = register(&client, topo, &me, timeout).await?;
        let known = match arrival {
            Arrival::All(regs) => publish_roster(&client, &regs).await?,
            Arrival::Roster(roster) => Known { nodes: Vec::new(), roster, not_ready: Vec::new(), faults: Vec::new() },
            Arrival::Missing { present, missing } => {
                return missing_nodes(topo, &present, missing, timeout, run_id).map(Joined::Missing)
            }
        };
        let Known { nodes, roster, not_ready, faults } = known;
        let all_ready = roster.not_ready.is_empty();
        if all_ready {
            same_backend(&roster, device)?;
        }
        let sizes = roster.sizes;
        let rank_offset = sizes[..topo.node_rank].iter().sum();
        let world = sizes.iter().fold(0usize, |w, n| w.saturating_add(*n));
        bounds.grow(store::Limits::for_run(sizes.len(), world));
        tracing::info!(node = topo.node_rank, world, rank_offset, %store_addr, all_ready, "rendezvous complete");
        let cluster = Cluster {
            client,
            store_addr,
            secret,
            node_rank: topo.node_rank,
            node_addr,
            hostname,
            nodes,
            sizes,
            faults,
            world,
            rank_offset,
            run_id,
            store_bounds: (topo.node_rank == 0).then(|| bounds.clone()),
        };
        Ok(if all_ready { Joined::All(cluster) } else { Joined::NotReady(cluster, not_ready, roster.not_ready) })
    }

    /// The most connections node 0's store has held at once (on node 0; `None` elsewhere).
    pub fn store_peak_connections(&self) -> Option<usize> {
        self.store_bounds.as_ref().map(store::Bounds::peak_connections)
    }

    /// A second connection to the store. Off the runtime's thread: the handshake needs node 0's
    /// store, which this same runtime serves.
    pub async fn connect_again(&self) -> Result<StoreClient> {
        let (addr, secret) = (self.store_addr.clone(), self.secret.clone());
        Ok(tokio::task::spawn_blocking(move || StoreClient::connect(&addr, Duration::from_secs(10), secret)).await??)
    }

    /// Forwards a stop posted by another node to `tx`.
    pub async fn watch_abort(&self, tx: mpsc::Sender<Stop>) -> Result<()> {
        let mut c = self.connect_again().await?;
        std::thread::spawn(move || {
            if let Ok(v) = c.get(ABORT_KEY, Duration::from_secs(30 * 24 * 3600)) {
                match serde_json::from_str::<Stop>(&v) {
                    Ok(stop) => {
                        let _ = tx.blocking_send(stop);
                    }
                    Err(e) => tracing::warn!("another node posted a malformed stop, not acted on: {e}"),
                }
            }
        });
        Ok(())
    }

    /// A way for the supervisor to tell the other nodes to stop, on a connection of its own,
    /// before it kills its workers (so theirs see the stop before they see broken links).
    pub async fn abort_handle(&self) -> Result<AbortHandle> {
        Ok(AbortHandle(self.connect_again().await?))
    }

    pub async fn post_outcome(&self, outcome: &NodeOutcome) -> Result<()> {
        let key = format!("outcome/{}", self.node_rank);
        let v = serde_json::to_string(outcome)?;
        blocking(&self.client, move |c| c.set(&key, &v)).await?;
        Ok(())
    }

    /// Node 0: what it heard from every node (its own outcome given) within `wait`.
    pub async fn gather(&self, own: NodeOutcome, wait: Duration) -> Vec<Heard> {
        let n = self.nodes.len();
        let got = blocking(&self.client, move |c| {
            let start = std::time::Instant::now();
            Ok((1..n).map(|k| hear(c, k, wait.saturating_sub(start.elapsed()))).collect::<Vec<Heard>>())
        })
        .await
        .unwrap_or_else(|e| {
            tracing::warn!("gathering the nodes' outcomes: {e}; no other node is heard");
            vec![Heard::Silent; n.saturating_sub(1)]
        });
        std::iter::once(Heard::Outcome(Box::new(own))).chain(got).collect()
    }

    /// Node 0: publishes the verdict and waits briefly until every node has read it, so the
    /// store outlives their reads.
    pub async fn publish_verdict(&self, v: &RunEnd) {
        let Ok(value) = serde_json::to_string(v) else { return };
        let n = self.nodes.len();
        let res = blocking(&self.client, move |c| {
            c.set(VERDICT_KEY, &value)?;
            let acks: Vec<String> = (1..n).map(|k| format!("ack/{k}")).collect();
            c.get_many(&acks, Duration::from_secs(10)).map(drop)
        })
        .await;
        if let Err(e) = res {
            tracing::warn!("not every node acknowledged the verdict: {e}");
        }
    }

    pub async fn await_verdict(&self, wait: Duration) -> Result<RunEnd> {
        let key = format!("ack/{}", self.node_rank);
        let v = blocking(&self.client, move |c| {
            let v = c.get(VERDICT_KEY, wait)?;
            c.set(&key, "1")?;
            Ok(v)
        })
        .await
        .context("no verdict from node 0")?;
        Ok(serde_json::from_str(&v)?)
    }
}

/// What node 0 learnt of every node at the rendezvous (the others learn only the roster).
struct Known {
    /// Every node, on node 0; empty on the others.
    nodes: Vec<NodeInfo>,
    roster: Roster,
    /// The findings of the nodes that cannot run the job's GPUs, bounded and placed (node 0).
    not_ready: Vec<Finding>,
    /// The nodes whose workers inject a test fault, and the fault (node 0).
    faults: Vec<(usize, String)>,
}

impl Registration {
    /// This node's registration: its place, name and address, and what it offers.
    fn of(node_rank: usize, hostname: &str, addr: &str, offer: Offer) -> Registration {
        Registration {
            info: NodeInfo { node_rank, hostname: hostname.to_string(), addr: addr.to_string(), nproc: offer.nproc },
            device: offer.device,
            devices: offer.devices,
            not_ready: offer.not_ready,
            fault: offer.fault,
        }
    }

    fn parse(posted: &str) -> Result<Registration> {
        serde_json::from_str(posted).context("malformed node registration")
    }
}

/// Where the run's store is: on node 0, its own, started here (loopback for a node alone);
/// elsewhere, node 0's.
async fn store_address(topo: &Topology, secret: &Option<Secret>, bounds: &store::Bounds) -> Result<String> {
    if topo.node_rank != 0 {
        return Ok(format!("{}:{}", topo.master_addr, topo.master_port));
    }
    let nofile = store::limits::raise_nofile();
    let wanted = bounds.limits().connections;
    if topo.nnodes > 1 && nofile < wanted as u64 {
        tracing::warn!(
            "node 0 may open {nofile} files but its store may hold {wanted} connections: raise the \
             open-file limit (ulimit -n) if ranks fail to connect"
        );
    }
    let listener = host(topo).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(store::serve_within(listener, secret.clone(), bounds.clone()));
    Ok(if topo.nnodes == 1 { format!("127.0.0.1:{port}") } else { format!("{}:{port}", topo.master_addr) })
}

/// A connection to the run's store, and this node's address as the store sees it.
async fn connect(
    store_addr: &str,
    timeout: Duration,
    secret: Option<Secret>,
) -> Result<(Arc<Mutex<StoreClient>>, String)> {
    let addr = store_addr.to_string();
    let client = tokio::task::spawn_blocking(move || StoreClient::connect(&addr, timeout, secret))
        .await?
        .map_err(|e| UsageError(e.to_string()))?;
    let node_addr = client.local_ip()?.to_string();
    Ok((Arc::new(Mutex::new(client)), node_addr))
}

/// Registers this node (`me`) and waits for every other: the run's id (node 0 names it) and
/// who arrived.
async fn register(
    client: &Arc<Mutex<StoreClient>>,
    topo: &Topology,
    me: &Registration,
    timeout: Duration,
) -> Result<(String, Arrival)> {
    let key = format!("node/{}", topo.node_rank);
    let value = serde_json::to_string(me)?;
    let nnodes = topo.nnodes;
    if topo.node_rank == 0 {
        let id = format!("{}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ"), std::process::id());
        blocking(client, move |c| c.set("run_id", &id)).await?;
    }
    let me = topo.node_rank;
    // The run id first: once node 0 has declared nodes missing, its store may go away.
    let arrived = blocking(client, move |c| {
        c.set(&key, &value)?;
        let run_id = c.get("run_id", timeout)?;
        Ok((run_id, arrival::wait_all(c, nnodes, timeout, me)?))
    })
    .await
    .map_err(|e| UsageError(format!("rendezvous: not every node arrived: {e}")))?;
    Ok(arrived)
}

/// Node 0, every node arrived: their registrations read, and the roster published before
/// anything is judged, so that every node judges the same roster.
async fn publish_roster(client: &Arc<Mutex<StoreClient>>, posted: &[String]) -> Result<Known> {
    let regs: Vec<Registration> = posted.iter().map(|r| Registration::parse(r)).collect::<Result<_>>()?;
    let faults = regs.iter().filter_map(|r| Some((r.info.node_rank, bounded(r.fault.as_deref()?)))).collect();
    let not_ready: Vec<Finding> = regs.iter().flat_map(|r| super::sent::accepted(&r.info, &r.not_ready)).collect();
    let devices: Vec<(DeviceKind, usize)> = regs.iter().map(|r| (r.device, r.info.nproc)).collect();
    let roster = Roster::new(&devices, &super::sent::summary(&not_ready));
    let r = roster.clone();
    blocking(client, move |c| arrival::publish(c, &r))
        .await
        .map_err(|e| UsageError(format!("rendezvous: publishing the roster: {e}")))?;
    Ok(Known { nodes: regs.into_iter().map(|r| r.info).collect(), roster, not_ready, faults })
}

/// The nodes of a run some of which never arrived within `waited`: those that did as they
/// registered, a missing one with what is known of it.
fn missing_nodes(
    topo: &Topology,
    present: &[Option<String>],
    missing: Vec<usize>,
    waited: Duration,
    run_id: String,
) -> Result<MissingNodes> {
    let present =
        present.iter().map(|r| r.as_deref().map(Registration::parse).transpose()).collect::<Result<Vec<_>>>()?;
    let not_ready = present.iter().flatten().flat_map(|r| super::sent::accepted(&r.info, &r.not_ready)).collect();
    let nodes = present
        .into_iter()
        .enumerate()
        .map(|(k, r)| match r {
            Some(r) => r.info,
            None => NodeInfo {
                node_rank: k,
                hostname: topo.node_names.get(k).cloned().unwrap_or_else(|| format!("node {k}")),
                addr: "unknown: it never registered".into(),
                nproc: 0,
            },
        })
        .collect();
    Ok(MissingNodes { nodes, missing, waited, run_id, not_ready })
}

/// Every node, ready, must run node 0's backend.
fn same_backend(roster: &Roster, device: DeviceKind) -> Result<()> {
    let other = if roster.device != device { Some((0, roster.device)) } else { roster.odd.first().copied() };
    match other {
        Some((k, other)) => Err(UsageError(format!(
            "node {k} runs the {other} backend but this node runs {device}: every node must use the same --device"
        ))
        .into()),
        None => Ok(()),
    }
}

/// What node 0 hears from node `k` in its store within `left`: its outcome, silence, or a
/// message that is not an outcome (which is not silence: the node spoke, and what it said is
/// named).
fn hear(c: &mut StoreClient, k: usize, left: Duration) -> Heard {
    let posted = match c.get(&format!("outcome/{k}"), left) {
        Ok(posted) => posted,
        Err(StoreError::Timeout(..)) => return Heard::Silent,
        Err(e) => {
            tracing::warn!(node = k, "reading node {k}'s outcome: {e}; it counts as silent");
            return Heard::Silent;
        }
    };
    read_outcome(k, &posted)
}

/// Node `k`'s posted outcome, or why it is not one.
fn read_outcome(k: usize, posted: &str) -> Heard {
    match serde_json::from_str(posted) {
        Ok(outcome) => Heard::Outcome(Box::new(outcome)),
        Err(e) => {
            // The error may quote what the node posted: kept bounded like any text it sends.
            let why = super::sent::cut(&e.to_string());
            tracing::warn!(node = k, "node {k} posted a malformed outcome: {why}");
            Heard::Malformed(why)
        }
    }
}

/// Node 0's store listener, on `topo.listen` (its port, or the first free one of its range),
/// announced to the parent process when asked. A single node listens on loopback only: nothing
/// outside the machine needs it. Else on the master address when it is one of this node's (a
/// host name's loopback addresses are passed over: other nodes would resolve it otherwise),
/// else on every interface, with a warning.
async fn host(topo: &Topology) -> Result<tokio::net::TcpListener> {
    let listener = bind(topo).await.map_err(|e| {
        UsageError(format!(
            "cannot host the rendezvous: {e} (is another job using it? pick --master-port or --master-port-range)"
        ))
    })?;
    if topo.announce_port {
        use std::io::Write;
        let notice = LauncherNotice::RendezvousBound { port: listener.local_addr()?.port() };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", notice.line()).and_then(|()| out.flush()).context("telling the port to the parent")?;
    }
    Ok(listener)
}

async fn bind(topo: &Topology) -> Result<tokio::net::TcpListener, store::BindError> {
    use std::net::{IpAddr, Ipv4Addr};
    if topo.nnodes == 1 {
        return store::listen_on(Ipv4Addr::LOCALHOST.into(), topo.listen);
    }
    let ips: Vec<IpAddr> = match topo.master_addr.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((topo.master_addr.as_str(), 0))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).filter(|ip| !ip.is_loopback()).collect())
            .unwrap_or_default(),
    };
    for ip in ips {
        match store::listen_on(ip, topo.listen) {
            Err(e) if e.address_not_here() => {}
            found => return found,
        }
    }
    tracing::warn!(
        "--master-addr {} is not an address of this node: hosting the rendezvous on every interface",
        topo.master_addr
    );
    store::listen_on(Ipv4Addr::UNSPECIFIED.into(), topo.listen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_outcome_that_does_not_read_is_malformed_not_silent() {
        match read_outcome(2, "{\"node_rank\": \"two\"}") {
            Heard::Malformed(e) => assert!(e.contains("invalid type"), "{e}"),
            other => panic!("not malformed: {other:?}"),
        }
        let long = serde_json::json!({"node_rank": "x".repeat(100_000)}).to_string();
        match read_outcome(2, &long) {
            Heard::Malformed(e) => assert!(e.chars().count() <= 2048, "{} characters", e.chars().count()),
            other => panic!("not malformed: {other:?}"),
        }
        let posted = serde_json::json!({"node_rank": 2, "ranks": [], "checks": [], "stop": null}).to_string();
        match read_outcome(2, &posted) {
            Heard::Outcome(o) => assert_eq!((o.node_rank, o.host.is_none()), (2, true)),
            other => panic!("not an outcome: {other:?}"),
        }
    }
}
