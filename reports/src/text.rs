//! The terminal summary: the verdict and findings first, then one table per check with each
//! rank's headline figures.

use std::fmt::Write;

use gpusanity_common::report::{CheckReport, NodeHealth, Report, RunStatus};

use crate::columns::{columns, status_word};

pub fn summary(report: &Report) -> String {
    let mut s = String::new();
    let verdict = match report.status {
        RunStatus::Passed => "CheckPassed",
        RunStatus::Failed => "CheckFailed",
        RunStatus::TimedOut => "CheckFailed (timed out)",
        RunStatus::Skipped => "skipped",
    };
    let _ = writeln!(
        s,
        "gpusanity {}  run {}  backend {}  {} node(s), {} rank(s)",
        report.gpusanity_version,
        report.run_id,
        report.backend,
        report.nodes.len(),
        report.ranks.len()
    );
    let _ = writeln!(s, "verdict: {verdict}: {}", report.summary);
    for f in &report.findings {
        let place = match (f.rank, &f.host) {
            (Some(r), Some(h)) => format!("rank {r} on {h}"),
            (None, Some(h)) => h.clone(),
            _ => "job".into(),
        };
        let _ = writeln!(s, "  [{:?}] {} {} ({}): {}", f.severity, f.code, f.check, place, f.message);
        if let Some(a) = &f.action {
            let _ = writeln!(s, "      action: {a}");
        }
    }
    nodes(&mut s, report);
    for c in &report.checks {
        let _ = writeln!(s);
        table(&mut s, report, c);
    }
    s
}

/// One line per node with its verdict, the faulty nodes, re-measures and the link test.
fn nodes(s: &mut String, report: &Report) {
    if report.node_verdicts.is_empty() {
        return;
    }
    let list: Vec<String> = report
        .node_verdicts
        .iter()
        .map(|v| {
            let h = match v.health {
                NodeHealth::Healthy => "healthy",
                NodeHealth::Suspect => "SUSPECT",
                NodeHealth::Faulty => "FAULTY",
            };
            if v.codes.is_empty() {
                format!("{} ({}) {h}", v.node_rank, v.host)
            } else {
                format!(
                    "{} ({}) {h}: {}",
                    v.node_rank,
                    v.host,
                    v.codes.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
                )
            }
        })
        .collect();
    let _ = writeln!(s, "nodes: {}", list.join("; "));
    if !report.faulty_nodes.is_empty() {
        let f: Vec<String> = report.faulty_nodes.iter().map(|n| n.to_string()).collect();
        let _ = writeln!(s, "faulty nodes (to isolate): {}", f.join(", "));
    }
    for r in &report.remeasured {
        let _ = writeln!(s, "re-measured: {r}");
    }
    if !report.pair_bandwidth.is_empty() {
        let pairs: Vec<String> = report
            .pair_bandwidth
            .iter()
            .map(|p| format!("{}-{} {:.3}", p.nodes[0], p.nodes[1], p.busbw_gbps))
            .collect();
        let _ = writeln!(s, "link test, GB/s per node pair: {}", pairs.join(", "));
    }
}

fn table(s: &mut String, report: &Report, c: &CheckReport) {
    let _ = writeln!(s, "{} — {} in {:.1} s", c.name, status_word(c.status), c.duration_s);
    let cols = columns(c.name);
    let mut head = format!("  {:>4}  {:<16} {:<24}", "rank", "host", "device");
    for (_, title) in cols {
        let _ = write!(head, " {title:>16}");
    }
    let _ = writeln!(s, "{head}  status");
    for r in &c.ranks {
        let info = report.ranks.iter().find(|i| i.rank == r.rank);
        let host = info.map(|i| i.host.as_str()).unwrap_or("?");
        let device: String = info.map(|i| i.device.chars().take(24).collect()).unwrap_or_default();
        let mut line = format!("  {:>4}  {:<16} {:<24}", r.rank, host, device);
        for (key, _) in cols {
            match r.metrics.get(*key) {
                Some(v) => {
                    let _ = write!(line, " {v:>16.2}");
                }
                None => {
                    let _ = write!(line, " {:>16}", "-");
                }
            }
        }
        let _ = write!(line, "  {}", status_word(r.status));
        if let Some(e) = &r.error {
            let _ = write!(line, ": {e}");
        }
        if let Some(why) = r.notes.get("not_applicable") {
            let _ = write!(line, ": {why}");
        }
        if let Some(j) = &r.fleet {
            let _ = write!(
                line,
                "  fleet: percentile {:.1} of {:.2} ± {:.2} ({} samples of {} nodes, window {}){}",
                j.percentile,
                j.centre,
                j.spread,
                j.samples,
                j.nodes,
                j.window,
                if j.below { " BELOW" } else { "" }
            );
        }
        let _ = writeln!(s, "{line}");
    }
}
