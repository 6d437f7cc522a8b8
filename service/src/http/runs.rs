//! The run routes: a run with its transitions, its stored report, and the resolution of a run
//! held by KeepJobHang.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use gpusanity_db::RunRow;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::scope::Scope;
use super::Api;
use crate::coordinator::finish::{self, ResolveError};

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
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// `pass` or `fail`.
    verdict: String,
    #[serde(default)]
    #[schema(default = "")]
    note: String,
}

/// The answer of `POST /v1/runs/{run_id}/resolve`.
#[derive(Serialize, ToSchema)]
pub struct Resolved {
    run: RunRow,
}

impl From<ResolveError> for ApiError {
    fn from(e: ResolveError) -> ApiError {
        let status = match &e {
            ResolveError::NoRun(_) => StatusCode::NOT_FOUND,
            ResolveError::NotHeld { .. } | ResolveError::ResolvedMeanwhile(_) => StatusCode::CONFLICT,
            ResolveError::Db(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// The run, if the scope sees its workspace; another workspace's run is a 404 like a missing one.
async fn visible_run(api: &Api, scope: &Scope, run_id: &str) -> Result<RunRow, ApiError> {
    match api.db.get_run(run_id).await? {
        Some(run) if scope.sees(&run.workspace_id) => Ok(run),
        _ => Err(ApiError::not_found(format!("no run `{run_id}`"))),
    }
}

/// A run and its state transitions.
#[utoipa::path(get, path = "/v1/runs/{run_id}", params(("run_id" = String, Path)), responses(
    (status = 200, description = "The run", body = RunDetail),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such run", body = ErrorBody)))]
pub async fn run(
    State(api): State<Arc<Api>>,
    Extension(scope): Extension<Scope>,
    Path(run_id): Path<String>,
) -> Result<Json<RunDetail>, ApiError> {
    let run = visible_run(&api, &scope, &run_id).await?;
    let transitions = api.db.transitions(&run_id).await?;
    let transitions =
        transitions.into_iter().map(|(state, detail, at_ms)| Transition { state, detail, at_ms }).collect();
    Ok(Json(RunDetail { run, transitions }))
}

/// The run's report.json as stored.
#[utoipa::path(get, path = "/v1/runs/{run_id}/report", params(("run_id" = String, Path)), responses(
    (status = 200, description = "report.json as stored", body = Object),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such run, or no report yet", body = ErrorBody)))]
pub async fn report(
    State(api): State<Arc<Api>>,
    Extension(scope): Extension<Scope>,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    visible_run(&api, &scope, &run_id).await?;
    let r = api.db.run_report(&run_id).await?;
    let r = r.ok_or_else(|| ApiError::not_found(format!("no report for run `{run_id}`")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], r).into_response())
}

/// Passes or fails a run held by KeepJobHang.
#[utoipa::path(post, path = "/v1/runs/{run_id}/resolve", params(("run_id" = String, Path)), request_body = ResolveBody, responses(
    (status = 200, description = "The resolved run", body = Resolved),
    (status = 400, description = "A malformed body", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such run", body = ErrorBody),
    (status = 409, description = "The run is not held", body = ErrorBody)))]
pub async fn resolve(
    State(api): State<Arc<Api>>,
    Extension(scope): Extension<Scope>,
    Path(run_id): Path<String>,
    body: Result<Json<ResolveBody>, JsonRejection>,
) -> Result<Json<Resolved>, ApiError> {
    visible_run(&api, &scope, &run_id).await?;
    let Ok(Json(body)) = body else {
        return Err(ApiError::bad_request("expected JSON {\"verdict\": \"pass\"|\"fail\", \"note\": \"...\"}"));
    };
    let pass = match body.verdict.as_str() {
        "pass" => true,
        "fail" => false,
        other => return Err(ApiError::bad_request(format!("verdict `{other}`: expected pass or fail"))),
    };
    let run = finish::resolve(&api.db, &api.topics, &api.report_url, &run_id, pass, &body.note).await?;
    api.outbox_wake.notify_one();
    Ok(Json(Resolved { run }))
}
