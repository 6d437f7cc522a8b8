//! The service's HTTP API (axum): `GET /health` (open); behind a bearer token the run routes
//! ([`runs`]: `GET /v1/runs/{run_id}`, `GET /v1/runs/{run_id}/report`,
//! `POST /v1/runs/{run_id}/resolve`), the notification rules and delivery log ([`rules`]), the
//! report browser's JSON routes (`GET /v1/runs`, `GET /v1/nodes/{name}/history`) and the
//! OpenAPI document `GET /v1/openapi.json` ([`openapi`]); and the browser's pages under `/ui`
//! with their own login ([`browser`]). Every JSON error is an [`ApiError`].

pub mod browser;
pub mod error;
pub mod openapi;
pub mod rules;
pub mod runs;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpusanity_common::secret::same;
use gpusanity_common::wire::Topics;
use gpusanity_db::Db;
use serde_json::json;
use tokio::sync::Notify;

use browser::Browser;
pub use error::ApiError;

pub struct Api {
    pub db: Db,
    pub topics: Topics,
    pub token: String,
    pub report_url: String,
    pub outbox_wake: Arc<Notify>,
    /// The report browser's pages open without a login.
    pub browser_public: bool,
    /// Where webhooks may go (`notifier.webhook_allow`).
    pub webhook_policy: gpusanity_notifier::guard::Policy,
}

pub fn router(api: Arc<Api>) -> Router {
    let browser = Browser::new(api.db.clone(), api.token.clone(), api.browser_public);
    let v1 = Router::new()
        .route("/v1/runs/{run_id}", get(runs::run))
        .route("/v1/runs/{run_id}/report", get(runs::report))
        .route("/v1/runs/{run_id}/resolve", post(runs::resolve))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .merge(rules::router(api.db.clone(), api.webhook_policy.clone()))
        .merge(browser::api(browser.clone()))
        .route_layer(middleware::from_fn_with_state(api.clone(), auth));
    Router::new().route("/health", get(health)).merge(v1).with_state(api).merge(browser::router(browser))
}

async fn auth(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    let given =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(t) if same(t.as_bytes(), api.token.as_bytes()) => next.run(req).await,
        _ => ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response(),
    }
}

async fn health(State(api): State<Arc<Api>>) -> Result<Response, ApiError> {
    api.db.ping().await.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")))?;
    Ok(Json(json!({ "status": "ok", "database": "ok" })).into_response())
}
