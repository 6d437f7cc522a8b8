//! The JSON API of the browser and the OpenAPI 3.1 document of the `/v1` run routes.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpusanity_db::{NodeHealthRow, RunListRow, RunRow};
use serde::Serialize;
use serde_json::json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{Browser, Paging, RunsQuery};

/// `{"error": "..."}`, the API's error body.
#[derive(Serialize, ToSchema)]
pub struct ApiError {
    error: String,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

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

/// A run and its state transitions (`GET /v1/runs/{run_id}`).
#[derive(Serialize, ToSchema)]
pub struct RunDetail {
    run: RunRow,
    transitions: Vec<Transition>,
}

#[derive(Serialize, ToSchema)]
pub struct Transition {
    state: String,
    detail: String,
    /// Unix milliseconds.
    at_ms: i64,
}

/// The body of `POST /v1/runs/{run_id}/resolve`.
#[derive(Serialize, ToSchema)]
pub struct ResolveBody {
    /// `pass` or `fail`.
    verdict: String,
    #[schema(default = "")]
    note: String,
}

/// The runs, newest first, filtered and paged.
#[utoipa::path(get, path = "/v1/runs", params(RunsQuery), responses(
    (status = 200, description = "One page of runs", body = RunList),
    (status = 400, description = "A malformed filter", body = ApiError),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError)))]
pub async fn runs(State(b): State<Arc<Browser>>, q: Result<Query<RunsQuery>, QueryRejection>) -> Response {
    let Ok(Query(q)) = q else { return error(StatusCode::BAD_REQUEST, "malformed query string") };
    let f = match q.filter() {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match b.db.list_runs(&f).await {
        Ok((runs, total)) => {
            Json(RunList { runs, total, page: f.offset / f.limit + 1, per_page: f.limit }).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// A node's health in each ended run that included it, newest first.
#[utoipa::path(get, path = "/v1/nodes/{name}/history", params(("name" = String, Path, description = "The node's name"), Paging), responses(
    (status = 200, description = "One page of the node's history (empty for a node never seen)", body = NodeHistory),
    (status = 400, description = "Malformed paging", body = ApiError),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError)))]
pub async fn node_history(
    State(b): State<Arc<Browser>>,
    Path(name): Path<String>,
    q: Result<Query<Paging>, QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else { return error(StatusCode::BAD_REQUEST, "malformed query string") };
    let (page, per_page) = match q.parse() {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match b.db.node_history(&name, per_page, (page - 1) * per_page).await {
        Ok((history, total)) => Json(NodeHistory { node: name, history, total, page, per_page }).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "The OpenAPI 3.1 document"),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError)))]
pub async fn openapi_json() -> Response {
    Json(openapi()).into_response()
}

// The service's own run routes (src/serve/http.rs), described here so the document covers
// every run route; these functions only carry the descriptions and are never routed.

/// A run and its state transitions.
#[utoipa::path(get, path = "/v1/runs/{run_id}", params(("run_id" = String, Path)), responses(
    (status = 200, description = "The run", body = RunDetail),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError),
    (status = 404, description = "No such run", body = ApiError)))]
#[allow(dead_code)]
fn run_doc() {}

/// The run's report.json as stored.
#[utoipa::path(get, path = "/v1/runs/{run_id}/report", params(("run_id" = String, Path)), responses(
    (status = 200, description = "report.json as stored", body = Object),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError),
    (status = 404, description = "No such run, or no report yet", body = ApiError)))]
#[allow(dead_code)]
fn report_doc() {}

/// Passes or fails a run held by KeepJobHang.
#[utoipa::path(post, path = "/v1/runs/{run_id}/resolve", params(("run_id" = String, Path)), request_body = ResolveBody, responses(
    (status = 200, description = "The resolved run: `{\"run\": ...}`", body = Object),
    (status = 400, description = "A malformed body", body = ApiError),
    (status = 401, description = "Missing or wrong bearer token", body = ApiError),
    (status = 404, description = "No such run", body = ApiError),
    (status = 409, description = "The run is not held", body = ApiError)))]
#[allow(dead_code)]
fn resolve_doc() {}

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "gpusanity service API", description = "Runs, reports and node history of `gpusanity serve`. Every route needs `Authorization: Bearer TOKEN`."),
    paths(runs, node_history, openapi_json, run_doc, report_doc, resolve_doc),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct Doc;

/// The OpenAPI 3.1 document of the `/v1` run routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    Doc::openapi()
}
