//! The HTML report: one self-contained page per run (no external assets, works offline),
//! rendered from the askama templates in the repository's `templates/` folder. Everything taken
//! from the report or the job is escaped by askama.

use askama::Template;
use gpusanity_common::report::{NodeHealth, NodeVerdict, Report, RunStatus};
use thiserror::Error;

use crate::validate::{validate, InvalidReport};

mod checks;
#[cfg(test)]
mod forged;
mod large;
#[cfg(test)]
mod large_tests;
mod sections;
#[cfg(test)]
mod tests;

/// What the page knows beyond `report.json`: the job it belongs to when the service ran it.
#[derive(Debug, Clone, Default)]
pub struct RunContext {
    /// The job's name or id; the page title. `None` for `gpusanity check` runs.
    pub job: Option<String>,
    pub workspace: Option<String>,
    /// The service's state changes of the run (Pending, Checking, ...), oldest first; empty
    /// for `gpusanity check` runs, whose own timeline is `report.events`.
    pub timeline: Vec<TimelineEntry>,
    /// Links shown at the top of the page (the browser's run list, the JSON report...).
    pub links: Vec<Link>,
    /// Parts of a stored report that this version could not read and left out
    /// ([`crate::lenient`]), listed at the top of the page.
    pub left_out: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct TimelineEntry {
    pub state: String,
    pub at: chrono::DateTime<chrono::Utc>,
    pub detail: String,
}

#[derive(Debug, Clone)]
pub struct Link {
    pub label: String,
    pub href: String,
}

#[derive(Template)]
#[template(path = "run.html")]
struct RunPage<'a> {
    report: &'a Report,
    title: String,
    workspace: Option<&'a str>,
    /// The service's state of the run (its timeline's last entry), which may differ from the
    /// check's own verdict (a KeepJobHang run resolved by hand, a timeout policy).
    service_state: Option<&'a str>,
    verdict: &'static str,
    verdict_text: &'static str,
    links: &'a [Link],
    left_out: &'a [String],
    faulty: Vec<NodeVerdict>,
    suspect: Vec<NodeVerdict>,
    /// The node table: in node order, or the outliers first on a large run.
    nodes: Vec<NodeVerdict>,
    /// Whether the run facts list every rank (not on a large run).
    rank_table: bool,
    findings: Vec<sections::FindingView<'a>>,
    checks: Vec<checks::CheckView>,
    pair_map: Option<crate::svg::HeatMap>,
    pair_summary: Option<large::PairSummary>,
    timelines: Vec<sections::TimelineView>,
    settings: Vec<(String, String)>,
    duration: String,
    started: String,
    finished: String,
}

/// How the page writes times (UTC).
const TIME: &str = "%Y-%m-%d %H:%M:%S%.3f UTC";

/// Why a report's page could not be rendered.
#[derive(Debug, Error)]
pub enum RenderError {
    /// The report is not one the page can show (an index out of range, a bound passed...).
    #[error("invalid report: {0}")]
    Invalid(#[from] InvalidReport),
    #[error("rendering the page: {0}")]
    Template(#[from] askama::Error),
}

/// The run's page; the report is validated first ([`validate`]).
pub fn run_page(report: &Report, ctx: &RunContext) -> Result<String, RenderError> {
    validate(report)?;
    let (verdict, verdict_text) = verdict(report.status);
    let settings = serde_json::to_value(&report.settings).map(|v| checks::pairs(&v)).unwrap_or_default();
    let secs = report.finished_at.signed_duration_since(report.started_at).num_milliseconds() as f64 / 1e3;
    Ok(RunPage {
        report,
        title: ctx.job.clone().unwrap_or_else(|| report.run_id.clone()),
        workspace: ctx.workspace.as_deref(),
        service_state: ctx.timeline.last().map(|t| t.state.as_str()),
        verdict,
        verdict_text,
        links: &ctx.links,
        left_out: &ctx.left_out,
        faulty: sections::faulty_nodes(report),
        suspect: sections::with_health(report, NodeHealth::Suspect),
        nodes: if large::is_large(report) {
            large::outliers_first(&report.node_verdicts)
        } else {
            report.node_verdicts.clone()
        },
        rank_table: !large::is_large(report),
        findings: report.findings.iter().map(sections::finding_view).collect(),
        checks: report.checks.iter().enumerate().map(|(i, c)| checks::check_view(report, i, c)).collect(),
        pair_map: sections::pair_map(report),
        pair_summary: large::pair_summary(report),
        timelines: sections::timelines(report, ctx),
        settings,
        duration: format!("{secs:.1} s"),
        started: report.started_at.format(TIME).to_string(),
        finished: report.finished_at.format(TIME).to_string(),
    }
    .render()?)
}

/// The CSS class and the words of a run's verdict.
pub fn verdict(status: RunStatus) -> (&'static str, &'static str) {
    match status {
        RunStatus::Passed => ("passed", "PASSED"),
        RunStatus::Failed => ("failed", "FAILED"),
        RunStatus::TimedOut => ("timed_out", "TIMED OUT"),
        RunStatus::Skipped => ("skipped", "SKIPPED"),
    }
}

/// Filters used by the templates.
mod filters {
    use gpusanity_common::report::NodeHealth;

    #[askama::filter_fn]
    pub fn health_class(h: &NodeHealth, _: &dyn askama::Values) -> askama::Result<&'static str> {
        Ok(match h {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Suspect => "suspect",
            NodeHealth::Faulty => "faulty",
        })
    }
}
