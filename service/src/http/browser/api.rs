//! The browser's JSON twins of its pages: the runs list and a node's history.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use gpusanity_db::reputation::{NodeDecision, Reputation};
use gpusanity_db::{NodeHealthRow, RunListRow};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Browser, Paging, RunsQuery};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::scope::Scope;

/// One page of runs.
#[derive(Serialize, ToSchema)]
pub struct RunList {
    runs: Vec<RunListRow>,
    /// How many runs match in all.
    total: i64,
    page: i64,
    per_page: i64,
}

/// One page of a node's history.
#[derive(Serialize, ToSchema)]
pub struct NodeHistory {
    node: String,
    history: Vec<NodeHealthRow>,
    total: i64,
    page: i64,
    per_page: i64,
}

/// A node's record over its last runs and the decisions about isolating it.
#[derive(Serialize, ToSchema)]
pub struct NodeReputation {
    node: String,
    reputation: Reputation,
    /// Newest first, at most 100.
    decisions: Vec<NodeDecision>,
    /// What the watch suspected while the node's jobs ran (docs/watch.md), newest first, at most 100.
    suspicions: Vec<gpusanity_db::watch::SuspicionRow>,
}

/// How many of the node's last runs the record covers (1 to 1000, default 20).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(default)]
#[into_params(parameter_in = Query)]
pub struct Window {
    window: Option<u32>,
}

impl Window {
    pub fn parse(&self) -> Result<u32, String> {
        match self.window {
            None => Ok(20),
            Some(w) if (1..=1000).contains(&w) => Ok(w),
            Some(w) => Err(format!("window must be 1 to 1000, got {w}")),
        }
    }
}

/// The runs, newest first, filtered and paged.
#[utoipa::path(get, path = "/v1/runs", params(RunsQuery), responses(
    (status = 200, description = "One page of runs", body = RunList),
    (status = 400, description = "A malformed filter", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn runs(
    State(b): State<Arc<Browser>>,
    Extension(scope): Extension<Scope>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Ok(Query(q)) = q else { return Err(ApiError::bad_request("malformed query string")) };
    let mut f = q.filter().map_err(ApiError::bad_request)?;
    let (runs, total) = if scope.restrict(&mut f) { b.db.list_runs(&f).await? } else { (Vec::new(), 0) };
    Ok(Json(RunList { runs, total, page: f.offset / f.limit + 1, per_page: f.limit }))
}

/// A node's health in each ended run that included it, newest first.
#[utoipa::path(get, path = "/v1/nodes/{name}/history", params(("name" = String, Path, description = "The node's name"), Paging), responses(
    (status = 200, description = "One page of the node's history (empty for a node never seen)", body = NodeHistory),
    (status = 400, description = "Malformed paging", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn node_history(
    State(b): State<Arc<Browser>>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
    q: Result<Query<Paging>, QueryRejection>,
) -> Result<Json<NodeHistory>, ApiError> {
    let Ok(Query(q)) = q else { return Err(ApiError::bad_request("malformed query string")) };
    let (page, per_page) = q.parse().map_err(ApiError::bad_request)?;
    let (history, total) = b.db.node_history(&name, scope.workspace(), per_page, (page - 1) * per_page).await?;
    Ok(Json(NodeHistory { node: name, history, total, page, per_page }))
}

/// A node's runs and failures by code and check over its last `window` runs, and every
/// decision about isolating it (re-check, quarantine, definitive failure), with its reason, and
/// what the watch suspected while its jobs ran.
#[utoipa::path(get, path = "/v1/nodes/{name}/reputation", params(("name" = String, Path, description = "The node's name"), Window), responses(
    (status = 200, description = "The node's record (empty for a node never seen)", body = NodeReputation),
    (status = 400, description = "A malformed window", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn node_reputation(
    State(b): State<Arc<Browser>>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
    q: Result<Query<Window>, QueryRejection>,
) -> Result<Json<NodeReputation>, ApiError> {
    let Ok(Query(q)) = q else { return Err(ApiError::bad_request("malformed query string")) };
    let window = q.parse().map_err(ApiError::bad_request)?;
    let reputation = b.db.reputation(&name, scope.workspace(), window).await?;
    let decisions = b.db.node_decisions(&name, scope.workspace(), 100).await?;
    let suspicions = b.db.node_suspicions(&name, scope.workspace(), 100).await?;
    Ok(Json(NodeReputation { node: name, reputation, decisions, suspicions }))
}
