//! The service's HTTP API (axum): `GET /health` (open), and behind a bearer token
//! `GET /v1/runs/{run_id}`, `GET /v1/runs/{run_id}/report` and
//! `POST /v1/runs/{run_id}/resolve` (pass or fail a run held by KeepJobHang); the report
//! browser's pages (`/ui`) and JSON routes (`/v1/runs`, `/v1/nodes/{name}/history`,
//! `/v1/openapi.json`) from `gpusanity_reports::browser`.

use std::sync::Arc;

use super::browser::{self, Browser};
use crate::coordinator::finish;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpusanity_common::secret::same;
use gpusanity_common::wire::Topics;
use gpusanity_db::Db;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;

pub struct Api {
    pub db: Db,
    pub topics: Topics,
    pub token: String,
    pub report_url: String,
    pub outbox_wake: Arc<Notify>,
    /// The report browser's pages open without a login.
    pub browser_public: bool,
}

pub fn router(api: Arc<Api>) -> Router {
    let browser = Browser::new(api.db.clone(), api.token.clone(), api.browser_public);
    let v1 = Router::new()
        .route("/v1/runs/{run_id}", get(run))
        .route("/v1/runs/{run_id}/report", get(report))
        .route("/v1/runs/{run_id}/resolve", post(resolve))
        .merge(super::rules::router(api.db.clone()))
        .merge(browser::api(browser.clone()))
        .route_layer(middleware::from_fn_with_state(api.clone(), auth));
    Router::new().route("/health", get(health)).merge(v1).with_state(api).merge(browser::router(browser))
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

async fn auth(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    let given =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if same(t.as_bytes(), api.token.as_bytes()) => next.run(req).await,
        _ => error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token"),
    }
}

async fn health(State(api): State<Arc<Api>>) -> Response {
    match api.db.ping().await {
        Ok(_) => Json(json!({ "status": "ok", "database": "ok" })).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")),
    }
}

async fn run(State(api): State<Arc<Api>>, Path(run_id): Path<String>) -> Response {
    match (api.db.get_run(&run_id).await, api.db.transitions(&run_id).await) {
        (Ok(Some(run)), Ok(tr)) => {
            let transitions: Vec<_> = tr
                .into_iter()
                .map(|(state, detail, at)| json!({ "state": state, "detail": detail, "at_ms": at }))
                .collect();
            Json(json!({ "run": run, "transitions": transitions })).into_response()
        }
        (Ok(None), _) => error(StatusCode::NOT_FOUND, format!("no run `{run_id}`")),
        (Err(e), _) | (_, Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn report(State(api): State<Arc<Api>>, Path(run_id): Path<String>) -> Response {
    match api.db.run_report(&run_id).await {
        Ok(Some(r)) => ([(header::CONTENT_TYPE, "application/json")], r).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no report for run `{run_id}`")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Resolve {
    /// `pass` or `fail`.
    verdict: String,
    #[serde(default)]
    note: String,
}

async fn resolve(
    State(api): State<Arc<Api>>,
    Path(run_id): Path<String>,
    body: Result<Json<Resolve>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(body)) = body else {
        return error(StatusCode::BAD_REQUEST, "expected JSON {\"verdict\": \"pass\"|\"fail\", \"note\": \"...\"}");
    };
    let pass = match body.verdict.as_str() {
        "pass" => true,
        "fail" => false,
        other => return error(StatusCode::BAD_REQUEST, format!("verdict `{other}`: expected pass or fail")),
    };
    match finish::resolve(&api.db, &api.topics, &api.report_url, &run_id, pass, &body.note).await {
        Ok(Ok(run)) => {
            api.outbox_wake.notify_one();
            Json(json!({ "run": run })).into_response()
        }
        Ok(Err(why)) if why.starts_with("no run") => error(StatusCode::NOT_FOUND, why),
        Ok(Err(why)) => error(StatusCode::CONFLICT, why),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
