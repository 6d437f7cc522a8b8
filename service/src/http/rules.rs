//! The notification API, merged into the service's authenticated `/v1` router:
//! `POST/GET /v1/workspaces/{ws}/notification-rules`,
//! `GET/PUT/DELETE /v1/workspaces/{ws}/notification-rules/{id}` and
//! `GET /v1/workspaces/{ws}/deliveries?status=&limit=` (the delivery log). The rules, their
//! storage and the deliveries are `gpusanity-notifier`'s.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use gpusanity_db::Db;
use gpusanity_notifier::guard::Policy;
use gpusanity_notifier::rules::RuleInput;
use gpusanity_notifier::store;
use serde::Deserialize;
use serde_json::json;

use super::error::{ApiError, ErrorBody};
use super::scope::Scope;

pub struct RulesApi {
    db: Db,
    /// Where webhooks may go: a literal address that is refused is a 400 at once.
    policy: Policy,
}

/// The routes, with their own state, ready to merge into a router of any state.
pub fn router<S: Clone + Send + Sync + 'static>(db: Db, policy: Policy) -> Router<S> {
    Router::new()
        .route("/v1/workspaces/{ws}/notification-rules", get(list).post(create))
        .route("/v1/workspaces/{ws}/notification-rules/{id}", get(show).put(update).delete(remove))
        .route("/v1/workspaces/{ws}/deliveries", get(deliveries))
        .with_state(Arc::new(RulesApi { db, policy }))
}

/// A workspace token reaches only its own workspace; any other is a 404.
fn visible(scope: &Scope, ws: &str) -> Result<(), ApiError> {
    match scope.sees(ws) {
        true => Ok(()),
        false => Err(ApiError::not_found(format!("no workspace `{ws}`"))),
    }
}

fn not_found(ws: &str, id: &str) -> ApiError {
    ApiError::not_found(format!("workspace `{ws}` has no notification rule `{id}`"))
}

/// The body as a valid rule for a valid workspace id, or what is wrong with them (a 400).
fn valid(api: &RulesApi, ws: &str, body: Result<Json<RuleInput>, JsonRejection>) -> Result<RuleInput, ApiError> {
    gpusanity_ingest::text::check_name(ws).map_err(|e| ApiError::bad_request(format!("workspace id {e}")))?;
    let Json(input) = body.map_err(|e| ApiError::bad_request(format!("malformed rule: {}", e.body_text())))?;
    input.validate().map_err(ApiError::bad_request)?;
    input.check_targets(&api.policy).map_err(ApiError::bad_request)?;
    Ok(input)
}

/// Adds a notification rule to the workspace.
#[utoipa::path(post, path = "/v1/workspaces/{ws}/notification-rules", params(("ws" = String, Path)),
    request_body = Object, responses(
    (status = 201, description = "The new rule", body = Object),
    (status = 400, description = "A malformed or invalid rule", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn create(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path(ws): Path<String>,
    body: Result<Json<RuleInput>, JsonRejection>,
) -> Result<Response, ApiError> {
    visible(&scope, &ws)?;
    let input = valid(&api, &ws, body)?;
    let rule = store::create_rule(&api.db, &ws, &input).await.map_err(ApiError::internal)?;
    Ok((StatusCode::CREATED, Json(rule.public())).into_response())
}

/// The workspace's notification rules: `{"rules": [...]}`.
#[utoipa::path(get, path = "/v1/workspaces/{ws}/notification-rules", params(("ws" = String, Path)), responses(
    (status = 200, description = "The rules", body = Object),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn list(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path(ws): Path<String>,
) -> Result<Response, ApiError> {
    visible(&scope, &ws)?;
    let rules = store::rules(&api.db, &ws).await.map_err(ApiError::internal)?;
    Ok(Json(json!({ "rules": rules.iter().map(|r| r.public()).collect::<Vec<_>>() })).into_response())
}

/// One notification rule.
#[utoipa::path(get, path = "/v1/workspaces/{ws}/notification-rules/{id}",
    params(("ws" = String, Path), ("id" = String, Path)), responses(
    (status = 200, description = "The rule", body = Object),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such rule in the workspace", body = ErrorBody)))]
pub async fn show(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path((ws, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    if !scope.sees(&ws) {
        return Err(not_found(&ws, &id));
    }
    let rule = store::get_rule(&api.db, &ws, &id).await.map_err(ApiError::internal)?;
    Ok(Json(rule.ok_or_else(|| not_found(&ws, &id))?.public()).into_response())
}

/// Replaces a notification rule.
#[utoipa::path(put, path = "/v1/workspaces/{ws}/notification-rules/{id}",
    params(("ws" = String, Path), ("id" = String, Path)), request_body = Object, responses(
    (status = 200, description = "The rule as stored", body = Object),
    (status = 400, description = "A malformed or invalid rule", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such rule in the workspace", body = ErrorBody)))]
pub async fn update(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path((ws, id)): Path<(String, String)>,
    body: Result<Json<RuleInput>, JsonRejection>,
) -> Result<Response, ApiError> {
    if !scope.sees(&ws) {
        return Err(not_found(&ws, &id));
    }
    let input = valid(&api, &ws, body)?;
    let rule = store::update_rule(&api.db, &ws, &id, &input).await.map_err(ApiError::internal)?;
    Ok(Json(rule.ok_or_else(|| not_found(&ws, &id))?.public()).into_response())
}

/// Deletes a notification rule.
#[utoipa::path(delete, path = "/v1/workspaces/{ws}/notification-rules/{id}",
    params(("ws" = String, Path), ("id" = String, Path)), responses(
    (status = 204, description = "Deleted"),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    (status = 404, description = "No such rule in the workspace", body = ErrorBody)))]
pub async fn remove(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path((ws, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    if !scope.sees(&ws) {
        return Err(not_found(&ws, &id));
    }
    match store::delete_rule(&api.db, &ws, &id).await.map_err(ApiError::internal)? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(not_found(&ws, &id)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryQuery {
    status: Option<String>,
    limit: Option<i64>,
}

/// The workspace's delivery log, newest first: `{"deliveries": [...]}`.
#[utoipa::path(get, path = "/v1/workspaces/{ws}/deliveries", params(("ws" = String, Path),
    ("status" = Option<String>, Query, description = "pending, sent or failed"),
    ("limit" = Option<i64>, Query, description = "1 to 1000 (default 100)")), responses(
    (status = 200, description = "The deliveries", body = Object),
    (status = 400, description = "A malformed query", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn deliveries(
    State(api): State<Arc<RulesApi>>,
    Extension(scope): Extension<Scope>,
    Path(ws): Path<String>,
    q: Result<Query<DeliveryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    visible(&scope, &ws)?;
    let Ok(Query(q)) = q else {
        return Err(ApiError::bad_request("query: expected ?status=pending|sent|failed&limit=1..1000"));
    };
    if let Some(s) = q.status.as_deref().filter(|s| !matches!(*s, "pending" | "sent" | "failed")) {
        return Err(ApiError::bad_request(format!("status `{s}`: expected pending, sent or failed")));
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit {limit}: expected 1 to 1000")));
    }
    let d = store::deliveries(&api.db, &ws, q.status.as_deref(), limit).await.map_err(ApiError::internal)?;
    Ok(Json(json!({ "deliveries": d })).into_response())
}
