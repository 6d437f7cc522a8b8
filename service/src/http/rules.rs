//! The notification API, merged into the service's authenticated `/v1` router:
//! `POST/GET /v1/workspaces/{ws}/notification-rules`,
//! `GET/PUT/DELETE /v1/workspaces/{ws}/notification-rules/{id}` and
//! `GET /v1/workspaces/{ws}/deliveries?status=&limit=` (the delivery log).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gpusanity_db::Db;
use serde::Deserialize;
use serde_json::json;

use gpusanity_notifier::rules::RuleInput;
use gpusanity_notifier::store;

struct RulesApi {
    db: Db,
}

/// The routes, with their own state, ready to merge into a router of any state.
pub fn router<S: Clone + Send + Sync + 'static>(db: Db) -> Router<S> {
    Router::new()
        .route("/v1/workspaces/{ws}/notification-rules", get(list).post(create))
        .route("/v1/workspaces/{ws}/notification-rules/{id}", get(show).put(update).delete(remove))
        .route("/v1/workspaces/{ws}/deliveries", get(deliveries))
        .with_state(Arc::new(RulesApi { db }))
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into() }))).into_response()
}

fn internal(e: impl std::fmt::Display) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn not_found(ws: &str, id: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("workspace `{ws}` has no notification rule `{id}`"))
}

/// The body as a valid rule, or what is wrong with it (a 400).
fn valid(body: Result<Json<RuleInput>, JsonRejection>) -> Result<RuleInput, String> {
    let Json(input) = body.map_err(|e| format!("malformed rule: {}", e.body_text()))?;
    input.validate()?;
    Ok(input)
}

async fn create(
    State(api): State<Arc<RulesApi>>,
    Path(ws): Path<String>,
    body: Result<Json<RuleInput>, JsonRejection>,
) -> Response {
    let input = match valid(body) {
        Ok(i) => i,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match store::create_rule(&api.db, &ws, &input).await {
        Ok(rule) => (StatusCode::CREATED, Json(rule.public())).into_response(),
        Err(e) => internal(e),
    }
}

async fn list(State(api): State<Arc<RulesApi>>, Path(ws): Path<String>) -> Response {
    match store::rules(&api.db, &ws).await {
        Ok(rules) => Json(json!({ "rules": rules.iter().map(|r| r.public()).collect::<Vec<_>>() })).into_response(),
        Err(e) => internal(e),
    }
}

async fn show(State(api): State<Arc<RulesApi>>, Path((ws, id)): Path<(String, String)>) -> Response {
    match store::get_rule(&api.db, &ws, &id).await {
        Ok(Some(rule)) => Json(rule.public()).into_response(),
        Ok(None) => not_found(&ws, &id),
        Err(e) => internal(e),
    }
}

async fn update(
    State(api): State<Arc<RulesApi>>,
    Path((ws, id)): Path<(String, String)>,
    body: Result<Json<RuleInput>, JsonRejection>,
) -> Response {
    let input = match valid(body) {
        Ok(i) => i,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match store::update_rule(&api.db, &ws, &id, &input).await {
        Ok(Some(rule)) => Json(rule.public()).into_response(),
        Ok(None) => not_found(&ws, &id),
        Err(e) => internal(e),
    }
}

async fn remove(State(api): State<Arc<RulesApi>>, Path((ws, id)): Path<(String, String)>) -> Response {
    match store::delete_rule(&api.db, &ws, &id).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => not_found(&ws, &id),
        Err(e) => internal(e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliveryQuery {
    status: Option<String>,
    limit: Option<i64>,
}

async fn deliveries(
    State(api): State<Arc<RulesApi>>,
    Path(ws): Path<String>,
    q: Result<Query<DeliveryQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return error(StatusCode::BAD_REQUEST, "query: expected ?status=pending|sent|failed&limit=1..1000");
    };
    if let Some(s) = q.status.as_deref().filter(|s| !matches!(*s, "pending" | "sent" | "failed")) {
        return error(StatusCode::BAD_REQUEST, format!("status `{s}`: expected pending, sent or failed"));
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return error(StatusCode::BAD_REQUEST, format!("limit {limit}: expected 1 to 1000"));
    }
    match store::deliveries(&api.db, &ws, q.status.as_deref(), limit).await {
        Ok(d) => Json(json!({ "deliveries": d })).into_response(),
        Err(e) => internal(e),
    }
}
