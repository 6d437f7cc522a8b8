//! The HTML pages. Every value from the job or the filters goes through askama's HTML escaping.

use std::sync::Arc;

use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use gpusanity_common::report::Report;
use gpusanity_db::reputation::Reputation;
use gpusanity_db::{FindingRow, NodeHealthRow, RunListRow, RunRow};

use super::render::{db_error, error_page, page};
use super::session::SessionView;
use super::{fmt_ms, node_href, run_href, Browser, Paging, RunsQuery, STATES};
use gpusanity_reports::html::{run_page, Link, RenderError, RunContext, TimelineEntry};
use gpusanity_reports::lenient::{self, Lenient};

/// A run as a row of the list.
struct Row {
    href: String,
    verdict: &'static str,
    verdict_text: &'static str,
    job: String,
    workspace: String,
    nodes: Vec<(String, String)>,
    faulty: Vec<(String, String)>,
    started: String,
    duration: String,
    summary: String,
}

/// The CSS class and the words of a stored state.
fn state_badge(state: &str, held: bool) -> (&'static str, &'static str) {
    match (state, held) {
        ("CheckPassed", _) => ("passed", "PASSED"),
        ("CheckFailed", _) => ("failed", "FAILED"),
        ("CheckCancelled", _) => ("skipped", "CANCELLED"),
        (_, true) => ("timed_out", "HELD"),
        _ => ("skipped", "CHECKING"),
    }
}

fn node_links(names: &[String]) -> Vec<(String, String)> {
    names.iter().map(|n| (n.clone(), node_href(n))).collect()
}

impl From<RunListRow> for Row {
    fn from(r: RunListRow) -> Row {
        let (verdict, verdict_text) = state_badge(&r.state, r.held);
        Row {
            href: run_href(&r.run_id),
            verdict,
            verdict_text,
            nodes: node_links(&r.nodes),
            faulty: node_links(&r.faulty_nodes),
            started: fmt_ms(r.created_at),
            duration: r
                .finished_at
                .map(|f| format!("{:.1} s", (f - r.created_at) as f64 / 1000.0))
                .unwrap_or_else(|| "-".into()),
            job: r.job_id,
            workspace: r.workspace_id,
            summary: r.summary,
        }
    }
}

#[derive(Template)]
#[template(path = "browser_runs.html")]
struct RunsPage<'a> {
    q: &'a RunsQuery,
    states: &'a [&'a str],
    error: String,
    rows: Vec<Row>,
    total: i64,
    first: i64,
    prev: Option<String>,
    next: Option<String>,
    /// The logout form's CSRF token (empty: no session, no form).
    csrf: String,
}

impl RunsPage<'_> {
    /// The value a filter field shows again.
    fn v<'s>(&self, o: &'s Option<String>) -> &'s str {
        o.as_deref().unwrap_or("")
    }
}

pub async fn runs(
    State(b): State<Arc<Browser>>,
    Extension(view): Extension<SessionView>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Response {
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let mut p = RunsPage {
        q: &q,
        states: &STATES,
        error: String::new(),
        rows: Vec::new(),
        total: 0,
        first: 0,
        prev: None,
        next: None,
        csrf: view.csrf.clone(),
    };
    let mut f = match q.filter() {
        Ok(f) => f,
        Err(e) => {
            p.error = e;
            return page(StatusCode::BAD_REQUEST, &p);
        }
    };
    let (rows, total) = if view.scope.restrict(&mut f) {
        match b.db.list_runs(&f).await {
            Ok(v) => v,
            Err(e) => return db_error(e),
        }
    } else {
        (Vec::new(), 0)
    };
    let page_no = f.offset / f.limit + 1;
    p.first = if rows.is_empty() { 0 } else { f.offset + 1 };
    p.prev = (page_no > 1).then(|| format!("/ui/runs?{}", q.with_page(page_no - 1)));
    p.next = (f.offset + f.limit < total).then(|| format!("/ui/runs?{}", q.with_page(page_no + 1)));
    p.rows = rows.into_iter().map(Row::from).collect();
    p.total = total;
    page(StatusCode::OK, &p)
}

/// A run without a report (still checking, or ended before any report came).
#[derive(Template)]
#[template(path = "browser_run.html")]
struct RunNoReport<'a> {
    run: &'a RunRow,
    verdict: &'static str,
    verdict_text: &'static str,
    nodes: Vec<(String, String)>,
    findings: Vec<FindingRow>,
    timeline: &'a [TimelineEntry],
    links: &'a [Link],
    started: String,
}

pub async fn run(
    State(b): State<Arc<Browser>>,
    Extension(view): Extension<SessionView>,
    Path(run_id): Path<String>,
) -> Response {
    let run = match b.db.get_run(&run_id).await {
        Ok(Some(r)) if view.scope.sees(&r.workspace_id) => r,
        Ok(_) => return error_page(StatusCode::NOT_FOUND, &format!("No run `{run_id}`.")),
        Err(e) => return db_error(e),
    };
    let (transitions, report) = match (b.db.transitions(&run_id).await, b.db.run_report(&run_id).await) {
        (Ok(t), Ok(r)) => (t, r),
        (Err(e), _) | (_, Err(e)) => return db_error(e),
    };
    let timeline: Vec<TimelineEntry> = transitions
        .into_iter()
        .map(|(state, detail, at)| TimelineEntry {
            state,
            at: chrono::DateTime::from_timestamp_millis(at).unwrap_or_default(),
            detail,
        })
        .collect();
    let names: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).collect();
    let mut links = vec![
        Link { label: "All runs".into(), href: "/ui/runs".into() },
        Link {
            label: format!("Runs of job {}", run.job_id),
            href: format!("/ui/runs?{}", serde_urlencoded::to_string([("job", &run.job_id)]).unwrap_or_default()),
        },
    ];
    links.extend(names.iter().map(|n| Link { label: format!("Node {n}"), href: node_href(n) }));
    if let Some(text) = report {
        let Lenient { report, left_out } = match lenient::read(&text) {
            Ok(r) => r,
            Err(e) => {
                return error_page(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("the stored report of run `{run_id}` is malformed: {e}"),
                )
            }
        };
        let ctx = RunContext {
            job: Some(run.job_id.clone()),
            workspace: Some(run.workspace_id.clone()),
            timeline,
            links,
            left_out,
        };
        return report_page(&run_id, report, ctx).await;
    }
    let findings = match b.db.run_findings(&run_id).await {
        Ok(f) => f,
        Err(e) => return db_error(e),
    };
    let (verdict, verdict_text) = state_badge(run.state.as_str(), run.held);
    let p = RunNoReport {
        run: &run,
        verdict,
        verdict_text,
        nodes: node_links(&names),
        findings,
        timeline: &timeline,
        links: &links,
        started: fmt_ms(run.created_at),
    };
    page(StatusCode::OK, &p)
}

/// The page of a stored report, rendered on a blocking thread: an invalid report is a 422 with
/// the reason, and a panic while rendering (caught by the task) a 500; the service goes on.
async fn report_page(run_id: &str, report: Report, ctx: RunContext) -> Response {
    match tokio::task::spawn_blocking(move || run_page(&report, &ctx)).await {
        Ok(Ok(html)) => Html(html).into_response(),
        Ok(Err(RenderError::Invalid(e))) => {
            tracing::warn!(run_id, "browser: the stored report is invalid: {e}");
            error_page(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("The stored report of run `{run_id}` cannot be shown: {e}."),
            )
        }
        Ok(Err(e)) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &format!("rendering the report: {e}")),
        Err(e) => {
            tracing::error!(run_id, "browser: rendering the report failed: {e}");
            error_page(StatusCode::INTERNAL_SERVER_ERROR, &format!("rendering the report of run `{run_id}` failed"))
        }
    }
}

/// One entry of a node's history as shown.
struct Entry {
    href: String,
    run_id: String,
    job: String,
    workspace: String,
    state: String,
    healthy: bool,
    codes: String,
    at: String,
}

#[derive(Template)]
#[template(path = "browser_node.html")]
struct NodePage<'a> {
    name: &'a str,
    entries: Vec<Entry>,
    /// The strip chart: (x, healthy, title) per entry, oldest first.
    strip: Vec<(usize, bool, String)>,
    strip_width: usize,
    total: i64,
    prev: Option<String>,
    next: Option<String>,
    /// The node's record over its last 20 runs.
    reputation: Reputation,
    /// Decisions about isolating it, newest first: (when, decision, reason, run link).
    decisions: Vec<(String, String, String, String)>,
    /// What the watch suspected while its jobs ran, newest first: (when, code, GPU, evidence,
    /// job, run link).
    suspicions: Vec<(String, &'static str, String, String, String, String)>,
    /// Each headline figure over time against the fleet, one sparkline per baseline key.
    sparks: Vec<super::figures::Spark>,
}

pub async fn node(
    State(b): State<Arc<Browser>>,
    Extension(view): Extension<SessionView>,
    Path(name): Path<String>,
    q: Result<Query<Paging>, QueryRejection>,
) -> Response {
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let (page_no, per_page) = match q.parse() {
        Ok(v) => v,
        Err(e) => return error_page(StatusCode::BAD_REQUEST, &e),
    };
    let (history, total) =
        match b.db.node_history(&name, view.scope.workspace(), per_page, (page_no - 1) * per_page).await {
            Ok(v) => v,
            Err(e) => return db_error(e),
        };
    let (reputation, decisions, suspicions) = match (
        b.db.reputation(&name, view.scope.workspace(), 20).await,
        b.db.node_decisions(&name, view.scope.workspace(), 20).await,
        b.db.node_suspicions(&name, view.scope.workspace(), 20).await,
    ) {
        (Ok(r), Ok(d), Ok(s)) => (r, d, s),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return db_error(e),
    };
    let suspicions = suspicions
        .into_iter()
        .map(|s| (fmt_ms(s.at_ms), s.code.as_str(), s.gpu, s.evidence, s.job_id, run_href(&s.run_id)))
        .collect();
    let policy = gpusanity_common::fleet::Policy::default();
    let sparks =
        match crate::fleet::node_figures(&b.db, &name, view.scope.workspace(), super::figures::PAGE_FIGURES, policy)
            .await
        {
            Ok(keys) => keys.iter().map(super::figures::spark).collect(),
            Err(e) => return db_error(e),
        };
    let decisions = decisions
        .into_iter()
        .map(|d| (fmt_ms(d.at), format!("{} ({})", d.decision, d.basis), d.reason, run_href(&d.run_id)))
        .collect();
    let href = |p: i64| format!("{}?page={p}&per_page={per_page}", node_href(&name));
    let strip = history
        .iter()
        .rev()
        .enumerate()
        .map(|(i, h)| (i * 14, h.healthy, format!("{} {}", fmt_ms(h.at), h.job_id)))
        .collect();
    let entries = history
        .into_iter()
        .map(|h: NodeHealthRow| Entry {
            href: run_href(&h.run_id),
            codes: h.codes.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", "),
            at: fmt_ms(h.at),
            run_id: h.run_id,
            job: h.job_id,
            workspace: h.workspace_id,
            state: h.state,
            healthy: h.healthy,
        })
        .collect::<Vec<_>>();
    let p = NodePage {
        name: &name,
        strip_width: entries.len() * 14,
        entries,
        strip,
        total,
        prev: (page_no > 1).then(|| href(page_no - 1)),
        next: (page_no * per_page < total).then(|| href(page_no + 1)),
        reputation,
        decisions,
        suspicions,
        sparks,
    };
    page(StatusCode::OK, &p)
}
