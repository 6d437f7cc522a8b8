//! The report browser of `gpusanity serve`: HTML pages under `/ui` (the runs with filters, a
//! run's report rendered by `gpusanity-reports`, a node's history; askama templates
//! `templates/browser_*.html`, no scripts, no external assets) and their JSON twins under `/v1`.
//!
//! [`router`] serves the pages with their own authentication (a session cookie set by a login
//! form posting a token, or none when `browser_public`); [`api`] gives the `/v1` routes,
//! which the caller mounts behind its bearer-token layer.

pub mod api;
mod auth;
pub mod figures;
pub mod fleet;
pub mod headers;
mod pages;
mod render;
pub mod session;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, NaiveDateTime, Utc};
use gpusanity_db::{Db, RunFilter};

use crate::http::scope::Tokens;
use serde::{Deserialize, Serialize};
use session::{LoginLimiter, SessionConfig, Sessions};

/// What the browser needs from the service.
pub struct Browser {
    pub db: Db,
    /// The tokens the login form takes, each with its scope.
    pub tokens: Arc<Tokens>,
    /// Serve the read-only pages without a login.
    pub public: bool,
    /// Cookies always get `Secure` (the service is reached over HTTPS only).
    pub secure_cookies: bool,
    /// The session cookie's Max-Age.
    session_ttl_s: i64,
    sessions: Sessions,
    limiter: LoginLimiter,
}

/// The browser's settings, from `[http]`.
#[derive(Debug, Clone)]
pub struct BrowserConfig {
    pub public: bool,
    pub secure_cookies: bool,
    pub sessions: SessionConfig,
    /// Failed logins per client address, and in all, per minute.
    pub login_failures_per_client: u32,
    pub login_failures_global: u32,
}

impl Browser {
    pub fn new(db: Db, tokens: Arc<Tokens>, c: BrowserConfig) -> Arc<Browser> {
        Arc::new(Browser {
            db,
            tokens,
            public: c.public,
            secure_cookies: c.secure_cookies,
            session_ttl_s: i64::try_from(c.sessions.ttl.as_secs()).unwrap_or(i64::MAX),
            sessions: Sessions::new(c.sessions),
            limiter: LoginLimiter::new(
                c.login_failures_per_client,
                c.login_failures_global,
                std::time::Duration::from_secs(60),
            ),
        })
    }
}

/// The pages: `/` (to `/ui/runs`), `/ui/runs`, `/ui/runs/{run_id}`, `/ui/nodes/{name}`, and
/// `/ui/login`, `/ui/logout`; every response with the security [`headers`].
pub fn router(b: Arc<Browser>) -> Router {
    let pages = Router::new()
        .route("/ui/runs", get(pages::runs))
        .route("/ui/runs/{run_id}", get(pages::run))
        .route("/ui/nodes/{name}", get(pages::node))
        .route("/ui/fleet", get(fleet::fleet_page))
        .route_layer(axum::middleware::from_fn_with_state(b.clone(), auth::pages));
    headers::secured(
        Router::new()
            .route("/", get(|| async { axum::response::Redirect::to("/ui/runs") }))
            .route("/ui/login", get(auth::login_form).post(auth::login))
            .route("/ui/logout", post(auth::logout))
            .merge(pages)
            .with_state(b),
    )
}

/// The JSON routes `GET /v1/runs`, `GET /v1/nodes/{name}/history` and `/reputation`, for the caller to put
/// behind its bearer-token layer.
pub fn api<S: Clone + Send + Sync + 'static>(b: Arc<Browser>) -> Router<S> {
    Router::new()
        .route("/v1/runs", get(api::runs))
        .route("/v1/nodes/{name}/history", get(api::node_history))
        .route("/v1/nodes/{name}/reputation", get(api::node_reputation))
        .route("/v1/nodes/{name}/figures", get(figures::figures))
        .route("/v1/fleet", get(fleet::fleet))
        .with_state(b)
}

/// The runs filters and paging, as query parameters (empty values do not filter).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(default)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Workspace id, exact.
    pub workspace: Option<String>,
    /// Job id, exact.
    pub job: Option<String>,
    /// Checking, CheckPassed, CheckFailed or CheckCancelled.
    pub state: Option<String>,
    /// Runs whose job had this node, exact.
    pub node: Option<String>,
    /// Runs started at or after: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC.
    pub from: Option<String>,
    /// Runs started before: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC.
    pub to: Option<String>,
    /// Page, from 1.
    #[param(value_type = Option<u32>)]
    pub page: Option<String>,
    /// Runs per page, 1 to 200 (default 50).
    #[param(value_type = Option<u32>)]
    pub per_page: Option<String>,
}

/// Paging: `page` from 1, `per_page` 1 to 200 (default 50).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(default)]
#[into_params(parameter_in = Query)]
pub struct Paging {
    /// Page, from 1.
    #[param(value_type = Option<u32>)]
    pub page: Option<String>,
    /// Entries per page, 1 to 200 (default 50).
    #[param(value_type = Option<u32>)]
    pub per_page: Option<String>,
}

pub const STATES: [&str; 4] = ["Checking", "CheckPassed", "CheckFailed", "CheckCancelled"];
const PER_PAGE: i64 = 50;
const MAX_PER_PAGE: i64 = 200;

/// `Some(value)` unless empty or blank.
fn given(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

impl Paging {
    /// (page from 1, per page), or why not.
    pub fn parse(&self) -> Result<(i64, i64), String> {
        let num = |v: &Option<String>, name: &str, default: i64, max: i64| match given(v) {
            None => Ok(default),
            Some(s) => match s.parse::<i64>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(format!("`{name}` must be a whole number from 1 to {max}, not `{s}`")),
            },
        };
        Ok((num(&self.page, "page", 1, 1_000_000)?, num(&self.per_page, "per_page", PER_PAGE, MAX_PER_PAGE)?))
    }
}

impl RunsQuery {
    /// The database filter, or why the parameters are wrong.
    pub fn filter(&self) -> Result<RunFilter, String> {
        let state = given(&self.state);
        if let Some(s) = &state {
            if !STATES.contains(&s.as_str()) {
                return Err(format!("unknown state `{s}`: expected one of {}", STATES.join(", ")));
            }
        }
        let (page, per_page) = Paging { page: self.page.clone(), per_page: self.per_page.clone() }.parse()?;
        Ok(RunFilter {
            workspace: given(&self.workspace),
            job: given(&self.job),
            state,
            node: given(&self.node),
            from_ms: given(&self.from).map(|t| parse_time(&t, "from")).transpose()?,
            to_ms: given(&self.to).map(|t| parse_time(&t, "to")).transpose()?,
            limit: per_page,
            offset: (page - 1) * per_page,
        })
    }

    /// The query string of these filters on another page.
    fn with_page(&self, page: i64) -> String {
        let mut q = self.clone();
        q.page = Some(page.to_string());
        serde_urlencoded::to_string(&q).unwrap_or_default()
    }
}

/// A time filter: RFC 3339, or a form's `YYYY-MM-DDTHH:MM[:SS]` taken as UTC; Unix ms.
fn parse_time(s: &str, name: &str) -> Result<i64, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    for f in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Ok(t.and_utc().timestamp_millis());
        }
    }
    Err(format!("`{name}`: `{s}` is not a time (RFC 3339, or YYYY-MM-DDTHH:MM in UTC)"))
}

/// Unix ms as people read it, in UTC.
fn fmt_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// What a path segment keeps as is: RFC 3986's unreserved characters.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// `value` percent-encoded as one path segment.
fn segment(value: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(value, SEGMENT)
}

/// `/ui/nodes/NAME`.
fn node_href(name: &str) -> String {
    format!("/ui/nodes/{}", segment(name))
}

/// `/ui/runs/ID`.
fn run_href(run_id: &str) -> String {
    format!("/ui/runs/{}", segment(run_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked_and_paging_is_bounded() {
        let q = |s: &str| serde_urlencoded::from_str::<RunsQuery>(s).unwrap();
        let f = q("workspace=ws&state=CheckFailed&node=&from=2026-11-30T10:00&per_page=10&page=3").filter().unwrap();
        assert_eq!((f.workspace.as_deref(), f.state.as_deref(), f.node), (Some("ws"), Some("CheckFailed"), None));
        assert_eq!(f.from_ms, Some(DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z").unwrap().timestamp_millis()));
        assert_eq!((f.limit, f.offset), (10, 20));
        assert!(q("state=Passed").filter().unwrap_err().contains("unknown state"));
        assert!(q("from=yesterday").filter().unwrap_err().contains("not a time"));
        assert!(q("per_page=1000").filter().is_err());
        assert!(q("page=0").filter().is_err());
        assert_eq!(q("to=2026-11-30T10:00:00%2B01:00").filter().unwrap().to_ms, Some(1_796_029_200_000));
        assert_eq!(q("job=a%26b&page=2").with_page(3), "job=a%26b&page=3");
        assert_eq!(node_href("a/b c-1.x"), "/ui/nodes/a%2Fb%20c-1.x");
    }
}
