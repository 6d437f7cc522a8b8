//! Isolating and returning one Node: read, compute the change, write it guarded by the
//! resourceVersion read (409 Conflict: read again and recompute), then the condition (status
//! subresource, strategic merge keyed by condition type) and an Event.

use crate::names::*;
use crate::{KubeError, Record};
use k8s_openapi::api::core::v1::{Event, Node, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{info, warn};

/// The effect of gpusanity's taint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum Effect {
    /// New pods are not scheduled on the node; running ones stay (the default).
    #[default]
    NoSchedule,
    /// Running pods without a toleration are evicted too.
    NoExecute,
}

impl Effect {
    fn as_str(self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

/// What an isolate or return call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The node was isolated now; the record is what was added.
    Isolated(Record),
    /// gpusanity had isolated it already: nothing changed.
    AlreadyIsolated,
    /// The node was returned to service: what the record said gpusanity added was removed.
    Returned(Record),
    /// gpusanity had not isolated it: nothing changed.
    NotOurs,
}

/// Isolates and returns Nodes through one client.
#[derive(Clone)]
pub struct Isolator {
    nodes: Api<Node>,
    events: Api<Event>,
    effect: Effect,
    dry_run: bool,
    max_tries: u32,
    conflicts: Arc<AtomicU64>,
}

impl Isolator {
    /// `dry_run` sends every write with `dryRun=All`: the API server validates and authorizes it
    /// but stores nothing.
    pub fn new(client: kube::Client, effect: Effect, dry_run: bool) -> Self {
        Isolator {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client, "default"),
            effect,
            dry_run,
            max_tries: 8,
            conflicts: Arc::default(),
        }
    }

    /// How many writes met a 409 Conflict and were recomputed on a fresh read.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    fn patch_params(&self) -> PatchParams {
        PatchParams { dry_run: self.dry_run, field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
    }

    /// Cordon, taint, label and condition `node` for finding `code`; `message` (the finding, as
    /// the caller words it: both callers name the codes first) is the condition's message and
    /// the Event's, written as given (sanitised), never prefixed again. Idempotent: a node gpusanity isolated already is left as it is.
    pub async fn isolate(&self, node: &str, code: &str, message: &str) -> Result<Outcome, KubeError> {
        check_name(node)?;
        let code = label_value(code);
        let message = crate::names::message(message);
        for _ in 0..self.max_tries {
            let current = self.get(node).await?;
            let meta = &current.metadata;
            if meta.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_KEY)) {
                return Ok(Outcome::AlreadyIsolated);
            }
            let spec = current.spec.clone().unwrap_or_default();
            let mut taints = spec.taints.clone().unwrap_or_default();
            let taint_added = !taints.iter().any(|t| t.key == TAINT_KEY);
            if taint_added {
                taints.push(Taint {
                    key: TAINT_KEY.into(),
                    value: Some(code.clone()),
                    effect: self.effect.as_str().into(),
                    time_added: None,
                });
            }
            let label_added = !meta.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_KEY));
            let record = Record {
                code: code.clone(),
                was_unschedulable: spec.unschedulable.unwrap_or(false),
                taint_added,
                label_added,
                at: chrono::Utc::now().to_rfc3339(),
            };
            let mut metadata = Map::new();
            metadata.insert("resourceVersion".into(), json!(meta.resource_version));
            metadata.insert("annotations".into(), json!({ ANNOTATION_KEY: to_json(&record) }));
            if label_added {
                metadata.insert("labels".into(), json!({ LABEL_KEY: code }));
            }
            let mut spec_patch = json!({ "unschedulable": true });
            if taint_added {
                spec_patch["taints"] = serde_json::to_value(&taints).unwrap_or(Value::Null);
            }
            let patch = json!({ "metadata": metadata, "spec": spec_patch });
            if !self.write(node, "isolate", &patch).await? {
                continue;
            }
            self.condition(node, "True", &code, &message).await?;
            self.event(&current, EVENT_ISOLATED, "Warning", &message).await?;
            info!(node, code = %code, dry_run = self.dry_run, "node isolated");
            return Ok(Outcome::Isolated(record));
        }
        Err(KubeError::Conflicts { what: "isolate", node: node.into(), tries: self.max_tries })
    }

    /// Return `node` to service if gpusanity isolated it, removing only what its record says
    /// gpusanity added.
    pub async fn restore(&self, node: &str) -> Result<Outcome, KubeError> {
        check_name(node)?;
        for _ in 0..self.max_tries {
            let current = self.get(node).await?;
            let meta = &current.metadata;
            let Some(raw) = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_KEY)) else {
                return Ok(Outcome::NotOurs);
            };
            let record: Record = serde_json::from_str(raw)
                .map_err(|e| KubeError::BadRecord { node: node.into(), why: e.to_string() })?;
            let mut metadata = Map::new();
            metadata.insert("resourceVersion".into(), json!(meta.resource_version));
            metadata.insert("annotations".into(), json!({ ANNOTATION_KEY: null }));
            if record.label_added {
                metadata.insert("labels".into(), json!({ LABEL_KEY: null }));
            }
            let mut spec_patch = Map::new();
            if !record.was_unschedulable {
                spec_patch.insert("unschedulable".into(), json!(null));
            }
            if record.taint_added {
                let spec = current.spec.clone().unwrap_or_default();
                let kept: Vec<Taint> =
                    spec.taints.unwrap_or_default().into_iter().filter(|t| t.key != TAINT_KEY).collect();
                spec_patch.insert("taints".into(), serde_json::to_value(&kept).unwrap_or(Value::Null));
            }
            let patch = json!({ "metadata": metadata, "spec": spec_patch });
            if !self.write(node, "return", &patch).await? {
                continue;
            }
            self.condition(node, "False", REASON_PASSED, "a later gpusanity check of this node passed").await?;
            self.event(&current, EVENT_RETURNED, "Normal", "returned to service: a later check passed").await?;
            info!(node, dry_run = self.dry_run, "node returned to service");
            return Ok(Outcome::Returned(record));
        }
        Err(KubeError::Conflicts { what: "return", node: node.into(), tries: self.max_tries })
    }

    /// Records on `node` (a Warning Event, reason `GpusanityIsolationRefused`) that it was not
    /// isolated, and why (the circuit breaker's cap and window); the Node itself is not changed.
    pub async fn refused(&self, node: &str, why: &str) -> Result<(), KubeError> {
        check_name(node)?;
        let current = self.get(node).await?;
        self.event(&current, EVENT_REFUSED, "Warning", &crate::names::message(why)).await
    }

    async fn get(&self, node: &str) -> Result<Node, KubeError> {
        self.nodes.get(node).await.map_err(|e| api_error("read", node, e))
    }

    /// The guarded merge patch; false on 409 Conflict (read again).
    async fn write(&self, node: &str, what: &'static str, patch: &Value) -> Result<bool, KubeError> {
        match self.nodes.patch(node, &self.patch_params(), &Patch::Merge(patch)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let n = self.conflicts.fetch_add(1, Ordering::Relaxed);
                warn!(node, what, "the Node changed since it was read (409): reading it again");
                // A short pause, spread by the conflict count, so that two writers part ways.
                tokio::time::sleep(std::time::Duration::from_millis(5 + n % 7 * 5)).await;
                Ok(false)
            }
            Err(e) => Err(api_error(what, node, e)),
        }
    }

    async fn condition(&self, node: &str, status: &str, reason: &str, message: &str) -> Result<(), KubeError> {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let patch = json!({ "status": { "conditions": [{
            "type": CONDITION_TYPE, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        self.nodes
            .patch_status(node, &self.patch_params(), &Patch::Strategic(&patch))
            .await
            .map(|_| ())
            .map_err(|e| api_error("set the condition of", node, e))
    }

    async fn event(&self, node: &Node, reason: &str, kind: &str, message: &str) -> Result<(), KubeError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let event: Event = serde_json::from_value(json!({
            "metadata": { "generateName": format!("{name}.gpusanity-") },
            "involvedObject": { "apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid },
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now,
            "source": { "component": FIELD_MANAGER }, "reportingComponent": FIELD_MANAGER,
        }))
        .map_err(|e| KubeError::Config(format!("event: {e}")))?;
        let params = PostParams { dry_run: self.dry_run, field_manager: Some(FIELD_MANAGER.into()) };
        self.events.create(&params, &event).await.map(|_| ()).map_err(|e| api_error("record an Event on", &name, e))
    }
}

fn check_name(node: &str) -> Result<(), KubeError> {
    if is_node_name(node) {
        Ok(())
    } else {
        Err(KubeError::BadNodeName(node.chars().take(80).collect()))
    }
}

fn to_json(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

fn api_error(what: &'static str, node: &str, e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(s) if s.code == 404 && what == "read" => KubeError::NoSuchNode(node.into()),
        kube::Error::Api(s) => KubeError::Refused { what, node: node.into(), code: s.code, message: s.message },
        other => KubeError::Unreachable(other.to_string()),
    }
}
