//! Who may open the pages. A browser cannot send the API's bearer header by itself, so the
//! login form takes a token once (the admin token or a workspace token) and answers with a
//! session cookie holding a random session id, never the token: HttpOnly (no script reads it),
//! SameSite=Strict (no other site's page sends it), Path=/ui, and Secure when
//! `http.secure_cookies` is on or the request came through a proxy that says
//! `X-Forwarded-Proto: https`. The session lives on the server ([`super::session`]) with the
//! token's scope and ends at logout, after its lifetime, or when idle too long.
//!
//! Every POST (login, logout) carries a CSRF token in a hidden field and must come from this
//! origin when the browser says where it came from (Origin, else Referer): the login form's
//! token is a random value also set as a cookie for `/ui/login` (compared on POST), the logout
//! form's is the session's own. Failed logins are limited per client address and in all (429
//! with Retry-After). With `browser_public` the read-only pages need no login.

use std::net::SocketAddr;
use std::sync::Arc;

use askama::Template;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use cookie::{Cookie, SameSite};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::session::{random_hex, SessionView};
use super::Browser;
use crate::http::scope::Scope;

const COOKIE: &str = "gpusanity_session";
/// The login form's CSRF value, for `/ui/login` only.
const LOGIN_COOKIE: &str = "gpusanity_login";

/// The values of the cookies named `name`.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .filter(move |c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// The live session of the request's cookie: (its id, what it holds).
fn session(b: &Browser, headers: &HeaderMap) -> Option<(String, SessionView)> {
    cookies(headers, COOKIE).find_map(|id| b.sessions.get(&id).map(|v| (id, v)))
}

/// The pages' gate: public (the admin's view, no forms), or a live session, or off to the
/// login form. The page finds the [`SessionView`] among the request's extensions.
pub async fn pages(State(b): State<Arc<Browser>>, mut req: Request, next: Next) -> Response {
    let view = match session(&b, req.headers()) {
        Some((_, v)) => v,
        None if b.public => SessionView { scope: Scope::Admin, csrf: String::new() },
        None => return Redirect::to("/ui/login").into_response(),
    };
    req.extensions_mut().insert(view);
    next.run(req).await
}

/// Whether a POST comes from this origin: Origin (else Referer) names the Host it was sent to.
/// A request with neither (not a browser, or one that hides them) is left to the CSRF token.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |h| headers.get(h).and_then(|v| v.to_str().ok());
    let Some(host) = get(header::HOST) else { return false };
    let from = match (get(header::ORIGIN), get(header::REFERER)) {
        (Some(o), _) => o,
        (None, Some(r)) => r,
        (None, None) => return true,
    };
    let Some(rest) = from.strip_prefix("http://").or_else(|| from.strip_prefix("https://")) else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority.eq_ignore_ascii_case(host)
}

fn forbidden(why: &str) -> Response {
    super::render::error_page(StatusCode::FORBIDDEN, why)
}

/// Whether cookies get `Secure`: configured, or a proxy says the client spoke HTTPS. A client
/// that sends the header itself over plain HTTP only makes its own cookie one that its browser
/// will not send back over HTTP: it can lock itself out, nobody else.
fn secure(b: &Browser, headers: &HeaderMap) -> bool {
    b.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

fn set_cookie(name: &'static str, value: String, path: &'static str, max_age: i64, secure: bool) -> String {
    Cookie::build((name, value))
        .path(path)
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(cookie::time::Duration::seconds(max_age))
        .build()
        .to_string()
}

#[derive(Template)]
#[template(path = "browser_login.html")]
struct LoginPage<'a> {
    error: &'a str,
    csrf: &'a str,
}

fn login_page(status: StatusCode, error: &str, csrf: &str) -> Response {
    super::render::page(status, &LoginPage { error, csrf })
}

/// The form, with a fresh CSRF value (also its cookie, for an hour).
pub async fn login_form(State(b): State<Arc<Browser>>, headers: HeaderMap) -> Response {
    let csrf = random_hex(32);
    let cookie = set_cookie(LOGIN_COOKIE, csrf.clone(), "/ui/login", 3600, secure(&b, &headers));
    ([(header::SET_COOKIE, cookie)], login_page(StatusCode::OK, "", &csrf)).into_response()
}

#[derive(Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

/// `given` equals one of `expected`, compared in constant time.
fn matches(given: &str, mut expected: impl Iterator<Item = String>) -> bool {
    !given.is_empty() && expected.any(|e| bool::from(e.as_bytes().ct_eq(given.as_bytes())))
}

pub async fn login(
    State(b): State<Arc<Browser>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<Login>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Login { token, csrf } = form.map(|Form(l)| l).unwrap_or(Login { token: String::new(), csrf: String::new() });
    if !same_origin(&headers) {
        return forbidden("This form was sent from another site.");
    }
    if !matches(&csrf, cookies(&headers, LOGIN_COOKIE)) {
        return forbidden("The login form expired or was not sent from this site: open it again.");
    }
    if let Err(wait) = b.limiter.check(peer.ip()) {
        let secs = wait.as_secs().saturating_add(1);
        let mut r = login_page(StatusCode::TOO_MANY_REQUESTS, "Too many failed logins: try again later.", &csrf);
        if let Ok(v) = header::HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let Some(scope) = b.tokens.scope(&token) else {
        b.limiter.failed(peer.ip());
        tracing::warn!(client = %peer.ip(), "browser: a failed login");
        return login_page(StatusCode::UNAUTHORIZED, "Wrong token.", &csrf);
    };
    let id = b.sessions.create(scope);
    let cookie = set_cookie(COOKIE, id, "/ui", b.session_ttl_s, secure(&b, &headers));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/runs")).into_response()
}

#[derive(Deserialize)]
pub struct Logout {
    #[serde(default)]
    csrf: String,
}

/// Ends the session (its cookie no longer opens anything) and clears the cookie.
pub async fn logout(
    State(b): State<Arc<Browser>>,
    headers: HeaderMap,
    form: Result<Form<Logout>, axum::extract::rejection::FormRejection>,
) -> Response {
    let csrf = form.map(|Form(l)| l.csrf).unwrap_or_default();
    if let Some((id, view)) = session(&b, &headers) {
        if !same_origin(&headers) || !matches(&csrf, std::iter::once(view.csrf)) {
            return forbidden("This form was not sent from this site.");
        }
        b.sessions.remove(&id);
    }
    let clear = set_cookie(COOKIE, String::new(), "/ui", 0, secure(&b, &headers));
    ([(header::SET_COOKIE, clear)], Redirect::to("/ui/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_and_referer_must_name_the_host() {
        let h = |pairs: &[(&'static str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        assert!(same_origin(&h(&[("host", "svc:8088")])));
        assert!(same_origin(&h(&[("host", "svc:8088"), ("origin", "http://svc:8088")])));
        assert!(same_origin(&h(&[("host", "svc:8088"), ("referer", "https://SVC:8088/ui/login?x")])));
        assert!(!same_origin(&h(&[("host", "svc:8088"), ("origin", "http://evil.example")])));
        assert!(!same_origin(&h(&[("host", "svc:8088"), ("origin", "null")])));
        assert!(!same_origin(&h(&[("host", "svc:8088"), ("referer", "http://svc:8088.evil.example/")])));
        assert!(!same_origin(&h(&[("origin", "http://svc:8088")])));
    }
}
