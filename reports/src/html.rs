//! The HTML report: one self-contained page per run (no external assets, works offline),
//! rendered from the askama templates in the repository's `templates/` folder. Everything taken
//! from the report or the job is escaped by askama.

use askama::Template;
use gpusanity_common::report::{Report, RunStatus};

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
    verdict: &'static str,
    verdict_text: &'static str,
    links: &'a [Link],
}

/// The run's page.
pub fn run_page(report: &Report, ctx: &RunContext) -> Result<String, askama::Error> {
    let (verdict, verdict_text) = verdict(report.status);
    RunPage { report, title: ctx.job.clone().unwrap_or_else(|| report.run_id.clone()), verdict, verdict_text, links: &ctx.links }.render()
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
    use gpusanity_common::report::{NodeHealth, Severity};

    #[askama::filter_fn]
    pub fn health_class(h: &NodeHealth, _: &dyn askama::Values) -> askama::Result<&'static str> {
        Ok(match h {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Suspect => "suspect",
            NodeHealth::Faulty => "faulty",
        })
    }

    #[askama::filter_fn]
    pub fn severity_class(s: &Severity, _: &dyn askama::Values) -> askama::Result<&'static str> {
        Ok(match s {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        })
    }
}
