//! A page rendered, or the error page in its place: what every page of the browser shares.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// `t` rendered, or an error page.
pub(super) fn page(status: StatusCode, t: &impl Template) -> Response {
    match t.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &format!("rendering the page: {e}")),
    }
}

#[derive(Template)]
#[template(path = "browser_error.html")]
struct ErrorPage<'a> {
    message: &'a str,
}

pub(super) fn error_page(status: StatusCode, message: &str) -> Response {
    match (ErrorPage { message }).render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(_) => (status, message.to_string()).into_response(),
    }
}

pub(super) fn db_error(e: gpusanity_db::DbError) -> Response {
    tracing::warn!(error = %e, "browser: database");
    error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
}
