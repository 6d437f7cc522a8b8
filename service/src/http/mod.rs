//! The service's HTTP API (axum): `GET /health` and `GET /ready` (open), `GET /metrics` (the
//! admin token or `http.metrics_token`; [`crate::ops`]); behind a bearer token the run routes
//! ([`runs`]: `GET /v1/runs/{run_id}`, `GET /v1/runs/{run_id}/report`,
//! `POST /v1/runs/{run_id}/resolve`), the notification rules and delivery log ([`rules`]), the
//! report browser's JSON routes (`GET /v1/runs`, `GET /v1/nodes/{name}/history`) and the
//! OpenAPI document `GET /v1/openapi.json` ([`openapi`]); and the browser's pages under `/ui`
//! with their own login ([`browser`]). A token is the admin's or a workspace's ([`scope`]):
//! a workspace token sees only its workspace. Every JSON error is an [`ApiError`].

pub mod browser;
pub mod error;
pub mod openapi;
pub mod rules;
pub mod runs;
pub mod scope;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpusanity_common::wire::Topics;
use gpusanity_db::Db;
use serde_json::json;
use tokio::sync::Notify;

use browser::Browser;
pub use error::ApiError;

pub struct Api {
    pub db: Db,
    pub topics: Topics,
    /// The admin token and the workspace tokens.
    pub tokens: Arc<scope::Tokens>,
    pub report_url: String,
    pub outbox_wake: Arc<Notify>,
    /// The report browser's pages, their login and sessions.
    pub browser: browser::BrowserConfig,
    /// Where webhooks may go (`notifier.webhook_allow`).
    pub webhook_policy: gpusanity_notifier::guard::Policy,
    /// What the broker probe saw (readiness).
    pub health: Arc<crate::ops::health::Health>,
    /// A token that may read `/metrics`, besides the admin token.
    pub metrics_token: Option<String>,
}

pub fn router(api: Arc<Api>) -> Router {
    let browser = Browser::new(api.db.clone(), api.tokens.clone(), api.browser.clone());
    let v1 = Router::new()
        .route("/v1/runs/{run_id}", get(runs::run))
        .route("/v1/runs/{run_id}/report", get(runs::report))
        .route("/v1/runs/{run_id}/resolve", post(runs::resolve))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .merge(rules::router(api.db.clone(), api.webhook_policy.clone()))
        .merge(browser::api(browser.clone()))
        .route_layer(middleware::from_fn_with_state(api.clone(), auth));
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .merge(v1)
        .with_state(api)
        .merge(browser::router(browser))
        .layer(middleware::from_fn(isolate))
}

/// Runs the request in a task of its own: a handler that panics fails its request with a 500
/// and the service goes on.
async fn isolate(req: Request, next: Next) -> Response {
    match tokio::spawn(next.run(req)).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("an HTTP handler failed: {e}");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error while handling the request")
                .into_response()
        }
    }
}

/// The bearer layer: the token's [`scope::Scope`] goes into the request's extensions, where
/// every route takes it from.
async fn auth(State(api): State<Arc<Api>>, mut req: Request, next: Next) -> Response {
    let given =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given.and_then(|t| api.tokens.scope(t)) {
        Some(scope) => {
            req.extensions_mut().insert(scope);
            next.run(req).await
        }
        None => ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response(),
    }
}

/// Liveness: the process answers.
async fn health() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// Readiness: the database, the broker and the job-events partitions; 503 says what is not ready.
async fn ready(State(api): State<Arc<Api>>) -> Response {
    let (ok, body) = api.health.ready(&api.db).await;
    let code = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body)).into_response()
}

/// The metrics in the Prometheus text format, for the admin token or `http.metrics_token`
/// (a workspace token is refused: the counts span every workspace).
async fn metrics(State(api): State<Arc<Api>>, req: Request) -> Response {
    let given =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let allowed = given.is_some_and(|t| {
        api.tokens.scope(t) == Some(scope::Scope::Admin)
            || api.metrics_token.as_deref().is_some_and(|m| scope::same_secret(m, t))
    });
    if !allowed {
        return ApiError::new(StatusCode::UNAUTHORIZED, "/metrics needs the admin token or http.metrics_token")
            .into_response();
    }
    let text = crate::ops::metrics::METRICS.scrape(&api.db).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}
