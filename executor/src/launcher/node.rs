//! The launchers' side of the rendezvous: node 0 hosts the store; every node registers, learns
//! its ranks, posts its outcome and receives the verdict through it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use gpusanity_common::report::{DeviceKind, NodeInfo, RunStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::arrival::{self, Arrival};
use super::rendezvous::Topology;
use super::supervise::{NodeOutcome, Stop};
use super::UsageError;
use crate::store::{self, StoreClient, StoreError};

/// What node 0 decides and every node acts on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verdict {
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
}

pub struct AbortHandle(StoreClient);

impl AbortHandle {
    pub fn publish(&mut self, stop: &Stop) {
        let res = serde_json::to_string(stop)
            .map_err(|e| StoreError::Protocol(e.to_string()))
            .and_then(|v| self.0.set("abort", &v));
        if let Err(e) = res {
            tracing::warn!("could not tell the other nodes to stop: {e}");
        }
    }
}

pub struct Cluster {
    client: Arc<Mutex<StoreClient>>,
    pub store_addr: String,
    pub node_rank: usize,
    pub node_addr: String,
    pub hostname: String,
    pub nodes: Vec<NodeInfo>,
    pub world: usize,
    pub rank_offset: usize,
    pub run_id: String,
}

/// The end of the rendezvous.
pub enum Joined {
    All(Cluster),
    /// Some nodes never arrived within the wait.
    Missing(MissingNodes),
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
        device: DeviceKind,
        nproc: usize,
        devices: &[String],
        timeout: Duration,
    ) -> Result<Joined> {
        let mut port = topo.master_port;
        if topo.node_rank == 0 {
            let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await.map_err(|e| {
                UsageError(format!(
                    "cannot host the rendezvous on port {port}: {e} (is another job using it? pick --master-port)"
                ))
            })?;
            port = listener.local_addr()?.port();
            tokio::spawn(store::serve(listener));
        }
        let store_addr = format!("{}:{port}", topo.master_addr);
        let addr = store_addr.clone();
        let client = tokio::task::spawn_blocking(move || StoreClient::connect(&addr, timeout))
            .await?
            .map_err(|e| UsageError(e.to_string()))?;
        let node_addr = client.local_ip()?.to_string();
        let client = Arc::new(Mutex::new(client));
        let hostname = match name {
            Some(n) => n.to_string(),
            None => {
                nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| node_addr.clone())
            }
        };
        let me = Registration {
            info: NodeInfo { node_rank: topo.node_rank, hostname: hostname.clone(), addr: node_addr.clone(), nproc },
            device,
            devices: devices.to_vec(),
        };
        let key = format!("node/{}", topo.node_rank);
        let value = serde_json::to_string(&me)?;
        let nnodes = topo.nnodes;
        if topo.node_rank == 0 {
            let id = format!("{}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ"), std::process::id());
            blocking(&client, move |c| c.set("run_id", &id)).await?;
        }
        let me = topo.node_rank;
        // The run id first: once node 0 has declared nodes missing, its store may go away.
        let (run_id, arrival) = blocking(&client, move |c| {
            c.set(&key, &value)?;
            let run_id = c.get("run_id", timeout)?;
            Ok((run_id, arrival::wait_all(c, nnodes, timeout, me)?))
        })
        .await
        .map_err(|e| UsageError(format!("rendezvous: not every node arrived: {e}")))?;
        let parse = |r: &String| serde_json::from_str::<Registration>(r).context("malformed node registration");
        let regs: Vec<Registration> = match arrival {
            Arrival::All(regs) => regs.iter().map(parse).collect::<Result<_>>()?,
            Arrival::Missing { present, missing } => {
                let present = present.iter().map(|r| r.as_ref().map(parse).transpose()).collect::<Result<Vec<_>>>()?;
                let nodes = present
                    .into_iter()
                    .enumerate()
                    .map(|(k, r)| match r {
                        Some(r) => r.info,
                        None => NodeInfo {
                            node_rank: k,
                            hostname: format!("node {k}"),
                            addr: "unknown: it never registered".into(),
                            nproc: 0,
                        },
                    })
                    .collect();
                return Ok(Joined::Missing(MissingNodes { nodes, missing, waited: timeout, run_id }));
            }
        };
        if let Some(other) = regs.iter().find(|r| r.device != device) {
            return Err(UsageError(format!(
                "node {} runs the {} backend but this node runs {}: every node must use the same --device",
                other.info.node_rank, other.device, device
            ))
            .into());
        }
        let nodes: Vec<NodeInfo> = regs.into_iter().map(|r| r.info).collect();
        let rank_offset = nodes[..topo.node_rank].iter().map(|n| n.nproc).sum();
        let world = nodes.iter().map(|n| n.nproc).sum();
        tracing::info!(node = topo.node_rank, world, rank_offset, %store_addr, "rendezvous complete");
        Ok(Joined::All(Cluster {
            client,
            store_addr,
            node_rank: topo.node_rank,
            node_addr,
            hostname,
            nodes,
            world,
            rank_offset,
            run_id,
        }))
    }

    /// Forwards a stop posted by another node to `tx`.
    pub fn watch_abort(&self, tx: mpsc::Sender<Stop>) -> Result<()> {
        let mut c = StoreClient::connect(&self.store_addr, Duration::from_secs(10))?;
        std::thread::spawn(move || {
            if let Ok(v) = c.get("abort", Duration::from_secs(30 * 24 * 3600)) {
                if let Ok(stop) = serde_json::from_str::<Stop>(&v) {
                    let _ = tx.blocking_send(stop);
                }
            }
        });
        Ok(())
    }

    /// A way for the supervisor to tell the other nodes to stop, on a connection of its own,
    /// before it kills its workers (so theirs see the stop before they see broken links).
    pub fn abort_handle(&self) -> Result<AbortHandle> {
        Ok(AbortHandle(StoreClient::connect(&self.store_addr, Duration::from_secs(10))?))
    }

    pub async fn post_outcome(&self, outcome: &NodeOutcome) -> Result<()> {
        let key = format!("outcome/{}", self.node_rank);
        let v = serde_json::to_string(outcome)?;
        blocking(&self.client, move |c| c.set(&key, &v)).await?;
        Ok(())
    }

    /// Node 0: every node's outcome (its own given), None for a node silent for `wait`.
    pub async fn gather(&self, own: NodeOutcome, wait: Duration) -> Vec<Option<NodeOutcome>> {
        let n = self.nodes.len();
        let got = blocking(&self.client, move |c| {
            let start = std::time::Instant::now();
            Ok((1..n)
                .map(|k| {
                    let left = wait.saturating_sub(start.elapsed());
                    c.get(&format!("outcome/{k}"), left).ok().and_then(|v| serde_json::from_str(&v).ok())
                })
                .collect::<Vec<Option<NodeOutcome>>>())
        })
        .await
        .unwrap_or_else(|_| vec![None; n.saturating_sub(1)]);
        std::iter::once(Some(own)).chain(got).collect()
    }

    /// Node 0: publishes the verdict and waits briefly until every node has read it, so the
    /// store outlives their reads.
    pub async fn publish_verdict(&self, v: &Verdict) {
        let Ok(value) = serde_json::to_string(v) else { return };
        let n = self.nodes.len();
        let res = blocking(&self.client, move |c| {
            c.set("verdict", &value)?;
            for k in 1..n {
                c.get(&format!("ack/{k}"), Duration::from_secs(10))?;
            }
            Ok(())
        })
        .await;
        if let Err(e) = res {
            tracing::warn!("not every node acknowledged the verdict: {e}");
        }
    }

    pub async fn await_verdict(&self, wait: Duration) -> Result<Verdict> {
        let key = format!("ack/{}", self.node_rank);
        let v = blocking(&self.client, move |c| {
            let v = c.get("verdict", wait)?;
            c.set(&key, "1")?;
            Ok(v)
        })
        .await
        .context("no verdict from node 0")?;
        Ok(serde_json::from_str(&v)?)
    }
}
