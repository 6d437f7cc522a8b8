//! The service's HTTP API (axum): `GET /health` (open); behind a bearer token the run routes
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

async fn health(State(api): State<Arc<Api>>) -> Result<Response, ApiError> {
    api.db.ping().await.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}")))?;
    Ok(Json(json!({ "status": "ok", "database": "ok" })).into_response())
}
