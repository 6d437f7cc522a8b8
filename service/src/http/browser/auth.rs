//! Who may open the pages. A browser cannot send the API's bearer header by itself, so the
//! login form takes the API token once and answers with a session cookie (HttpOnly: no script
//! reads it; SameSite=Strict: no other site's page sends it; Path=/ui). The cookie holds a
//! random per-process session value, never the token. With `browser_public` the read-only pages
//! need no login.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use cookie::{Cookie, SameSite};
use serde::Deserialize;

use super::Browser;
use gpusanity_common::secret::same;

const COOKIE: &str = "gpusanity_session";

fn has_session(b: &Browser, headers: &HeaderMap) -> bool {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .any(|c| c.name() == COOKIE && same(c.value().as_bytes(), b.session.as_bytes()))
}

/// The pages' gate: public, or a session cookie, or off to the login form.
pub async fn pages(State(b): State<Arc<Browser>>, req: Request, next: Next) -> Response {
    if b.public || has_session(&b, req.headers()) {
        next.run(req).await
    } else {
        Redirect::to("/ui/login").into_response()
    }
}

#[derive(Template)]
#[template(path = "browser_login.html")]
struct LoginPage<'a> {
    error: &'a str,
}

fn login_page(status: StatusCode, error: &str) -> Response {
    super::pages::page(status, &LoginPage { error })
}

pub async fn login_form() -> Response {
    login_page(StatusCode::OK, "")
}

#[derive(Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
}

fn set_cookie(value: String, max_age: cookie::time::Duration) -> String {
    Cookie::build((COOKIE, value))
        .path("/ui")
        .http_only(true)
        .same_site(SameSite::Strict)
        .max_age(max_age)
        .build()
        .to_string()
}

pub async fn login(
    State(b): State<Arc<Browser>>,
    form: Result<Form<Login>, axum::extract::rejection::FormRejection>,
) -> Response {
    let token = form.map(|Form(l)| l.token).unwrap_or_default();
    if !same(token.as_bytes(), b.token.as_bytes()) {
        return login_page(StatusCode::UNAUTHORIZED, "Wrong token.");
    }
    let cookie = set_cookie(b.session.clone(), cookie::time::Duration::hours(12));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/runs")).into_response()
}

pub async fn logout() -> Response {
    ([(header::SET_COOKIE, set_cookie(String::new(), cookie::time::Duration::ZERO))], Redirect::to("/ui/login"))
        .into_response()
}
