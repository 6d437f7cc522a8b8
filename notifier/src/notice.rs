//! One notification's content, taken from an output event: what every channel and format says.

use gpusanity_common::findings::Code;
use gpusanity_common::wire::output::{FailReason, OutputBody, OutputEvent};

#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// CheckFailed, CheckPassed, NodeIsolated or NodeSuspected.
    pub event_type: &'static str,
    /// `passed`, `failed`, `timed out` (a CheckFailed for an overrun) or `node isolated`.
    pub verdict: &'static str,
    pub reason: Option<FailReason>,
    pub workspace_id: String,
    pub job_id: String,
    pub run_id: Option<String>,
    pub event_id: String,
    pub at: String,
    pub summary: String,
    pub faulty_nodes: Vec<String>,
    /// For NodeIsolated: the finding codes.
    pub codes: Vec<Code>,
    pub report_url: Option<String>,
}

impl Notice {
    /// `report_url`: the `coordinator.report_url` template, for events that carry no link.
    pub fn from_event(ev: &OutputEvent, report_url: &str) -> Notice {
        let template_url = ev.run_id.as_ref().map(|r| report_url.replace("{run_id}", r));
        let (verdict, reason, summary, faulty, codes, url) = match &ev.body {
            OutputBody::CheckPassed { summary, report_url, .. } => {
                ("passed", None, summary.clone(), vec![], vec![], Some(report_url.clone()))
            }
            OutputBody::CheckFailed { summary, faulty_nodes, report_url, reason, .. } => {
                let v = if *reason == FailReason::TimedOut { "timed out" } else { "failed" };
                (v, Some(*reason), summary.clone(), faulty_nodes.clone(), vec![], Some(report_url.clone()))
            }
            OutputBody::NodeIsolated { node, codes, reason, .. } => {
                ("node isolated", None, reason.clone(), vec![node.clone()], codes.clone(), template_url)
            }
            OutputBody::NodeSuspected { node, gpu, code, evidence, since } => (
                "node suspected",
                None,
                format!("{code} on GPU {gpu} since {}: {evidence}", since.to_rfc3339()),
                vec![node.clone()],
                vec![],
                template_url,
            ),
            OutputBody::SanityCheckStarted { .. } => ("started", None, String::new(), vec![], vec![], template_url),
            OutputBody::CheckSkipped { reason } => ("skipped", None, reason.clone(), vec![], vec![], None),
            OutputBody::CheckCancelled { reason } => ("cancelled", None, reason.clone(), vec![], vec![], template_url),
        };
        Notice {
            event_type: ev.body.type_name(),
            verdict,
            reason,
            workspace_id: ev.workspace_id.clone(),
            job_id: ev.job_id.clone(),
            run_id: ev.run_id.clone(),
            event_id: ev.event_id.clone(),
            at: ev.at.to_rfc3339(),
            summary,
            faulty_nodes: faulty,
            codes,
            report_url: url.filter(|u| !u.is_empty()),
        }
    }

    /// A one-line title, e.g. `gpusanity: job train-7 failed the check (workspace ws-1)`.
    pub fn title(&self) -> String {
        self.title_with(&|v| v.to_string())
    }

    /// The title with every value from outside (job, workspace, node names) passed through
    /// `esc`, the receiver's escaping.
    pub fn title_with(&self, esc: &dyn Fn(&str) -> String) -> String {
        let nodes: Vec<String> = self.faulty_nodes.iter().map(|n| esc(n)).collect();
        match self.event_type {
            "NodeIsolated" => format!(
                "gpusanity: node {} isolated (job {}, workspace {})",
                nodes.join(", "),
                esc(&self.job_id),
                esc(&self.workspace_id)
            ),
            "NodeSuspected" => format!(
                "gpusanity: node {} suspected while job {} runs (workspace {})",
                nodes.join(", "),
                esc(&self.job_id),
                esc(&self.workspace_id)
            ),
            _ => format!(
                "gpusanity: job {} {} the check (workspace {})",
                esc(&self.job_id),
                self.verdict_phrase(),
                esc(&self.workspace_id)
            ),
        }
    }

    fn verdict_phrase(&self) -> &'static str {
        match self.verdict {
            "passed" => "passed",
            "timed out" => "timed out in",
            _ => "failed",
        }
    }

    /// The plain-text body shared by email and chat formats.
    pub fn text_lines(&self) -> Vec<String> {
        self.text_lines_with(&|v| v.to_string(), true)
    }

    /// The codes, comma-separated.
    pub fn codes_text(&self) -> String {
        self.codes.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The body with every value from outside (names, codes, the summary with the findings'
    /// messages) passed through `esc`; the report's address (the operator's own) as it is, and
    /// only when `with_url` (a format that links it otherwise leaves it out).
    pub fn text_lines_with(&self, esc: &dyn Fn(&str) -> String, with_url: bool) -> Vec<String> {
        let list = |v: &[String]| v.iter().map(|s| esc(s)).collect::<Vec<_>>().join(", ");
        let mut l = vec![format!("Verdict: {}", self.verdict)];
        if !self.faulty_nodes.is_empty() {
            l.push(format!("Faulty nodes: {}", list(&self.faulty_nodes)));
        }
        if !self.codes.is_empty() {
            // Codes are this version's own names: nothing to escape.
            l.push(format!("Findings: {}", self.codes_text()));
        }
        if !self.summary.is_empty() {
            l.push(format!("Summary: {}", esc(&self.summary)));
        }
        l.push(format!("Job: {} (workspace {})", esc(&self.job_id), esc(&self.workspace_id)));
        if let Some(r) = &self.run_id {
            l.push(format!("Run: {}", esc(r)));
        }
        l.push(format!("At: {}", self.at));
        if let (Some(u), true) = (&self.report_url, with_url) {
            l.push(format!("Report: {u}"));
        }
        l
    }
}
