//! The browser's JSON twins of its pages: the runs list and a node's history.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use gpusanity_db::{NodeHealthRow, RunListRow};
use serde::Serialize;
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
