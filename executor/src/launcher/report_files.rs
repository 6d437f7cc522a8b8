//! The run's report in its directory: `report.json` and `report.html`, each written whole (a
//! reader never sees half a file), and rewritten with the last event after a KeepJobHang hold.

use std::path::Path;

use anyhow::{Context, Result};
use gpusanity_common::report::Report;

use super::events::EventLog;

/// `report.json` and `report.html` in `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Compact JSON: a large run's report is a third of its indented size (`jq .` indents it).
    write_atomic(&dir.join("report.json"), &serde_json::to_vec(report)?)?;
    write_html(&dir.join("report.html"), report, &Default::default())
}

/// The HTML page beside report.json.
pub fn write_html(path: &Path, report: &Report, ctx: &gpusanity_reports::html::RunContext) -> Result<()> {
    let page = gpusanity_reports::html::run_page(report, ctx).context("rendering the HTML report")?;
    write_atomic(path, page.as_bytes())
}

/// Writes `PATH.tmp`, then renames it over `path`: a reader never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// After a KeepJobHang hold ends, the report gains the final event too.
pub(super) fn rewrite_events(dir: &Path, log: &EventLog) -> Result<()> {
    let path = dir.join("report.json");
    let mut report: Report =
        serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)?;
    report.events = log.events.clone();
    write_report(dir, &report)
}
