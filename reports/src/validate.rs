//! Checks of a report before it is rendered. A stored report.json comes from outside the
//! renderer (an agent, a file, a database row), so every index the page looks up or lays out
//! (node indexes of ranks, findings, verdicts, the nodes to isolate, node pairs) must be in
//! range, rank numbers and counts bounded, figures it divides by or formats as durations
//! finite, and strings of bounded length. Figures that are measurements may be NaN or
//! infinite: the page shows them as `n/a`.

use gpusanity_common::report::Report;
use thiserror::Error;

/// The most nodes a report may have.
pub const MAX_NODES: usize = 4096;
/// Rank numbers are below this (ranks are matched by number, never used as indexes).
pub const MAX_RANKS: usize = 1 << 17;
/// The most entries of one list: checks, findings, events, sweep points, metrics, notes, the
/// items of a check's detail.
pub const MAX_ITEMS: usize = 1 << 17;
/// The most node pairs of the link test.
pub const MAX_PAIRS: usize = 1 << 20;
/// The most bytes of a name (host, device, check, finding code, run id, metric, note key).
pub const MAX_NAME: usize = 1024;
/// The most bytes of one text (a message, an error, a note, a summary).
pub const MAX_TEXT: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum InvalidReport {
    #[error("{what} is {value}, out of range (the report has {len} node(s))")]
    NodeOutOfRange { what: String, value: usize, len: usize },
    #[error("{what} is {value}, out of range (rank numbers are below {MAX_RANKS})")]
    RankOutOfRange { what: String, value: usize },
    #[error("{what} is not a finite number ({value})")]
    NotFinite { what: String, value: f64 },
    #[error("{what} has {len} entries (at most {max})")]
    TooMany { what: String, len: usize, max: usize },
    #[error("{what} is {len} bytes long (at most {max})")]
    TooLong { what: String, len: usize, max: usize },
}

/// Checks `r`; the first problem found is the error.
pub fn validate(r: &Report) -> Result<(), InvalidReport> {
    let n = r.nodes.len();
    count("nodes", n, MAX_NODES)?;
    count("ranks", r.ranks.len(), MAX_RANKS)?;
    count("checks", r.checks.len(), MAX_ITEMS)?;
    count("findings", r.findings.len(), MAX_ITEMS)?;
    count("events", r.events.len(), MAX_ITEMS)?;
    count("node_verdicts", r.node_verdicts.len(), MAX_NODES)?;
    count("faulty_nodes", r.faulty_nodes.len(), MAX_NODES)?;
    count("remeasured", r.remeasured.len(), MAX_ITEMS)?;
    count("pair_bandwidth", r.pair_bandwidth.len(), MAX_PAIRS)?;
    for (what, len, max) in [
        ("run_id", r.run_id.len(), MAX_NAME),
        ("gpusanity_version", r.gpusanity_version.len(), MAX_NAME),
        ("summary", r.summary.len(), MAX_TEXT),
    ] {
        bytes(what, len, max)?;
    }
    for (i, x) in r.nodes.iter().enumerate() {
        node(&format!("nodes[{i}].node_rank"), x.node_rank, n)?;
        bytes(&format!("nodes[{i}].hostname"), x.hostname.len(), MAX_NAME)?;
        bytes(&format!("nodes[{i}].addr"), x.addr.len(), MAX_NAME)?;
    }
    for (i, x) in r.ranks.iter().enumerate() {
        rank(&format!("ranks[{i}].rank"), x.rank)?;
        rank(&format!("ranks[{i}].local_rank"), x.local_rank)?;
        node(&format!("ranks[{i}].node_rank"), x.node_rank, n)?;
        bytes(&format!("ranks[{i}].host"), x.host.len(), MAX_NAME)?;
        bytes(&format!("ranks[{i}].device"), x.device.len(), MAX_NAME)?;
    }
    for (i, c) in r.checks.iter().enumerate() {
        let at = |s: &str| format!("checks[{i}].{s}");
        finite(&at("duration_s"), c.duration_s)?;
        count(&at("ranks"), c.ranks.len(), MAX_RANKS)?;
        for (j, x) in c.ranks.iter().enumerate() {
            let at = |s: &str| format!("checks[{i}].ranks[{j}].{s}");
            rank(&at("rank"), x.rank)?;
            count(&at("metrics"), x.metrics.len(), MAX_ITEMS)?;
            count(&at("sweep"), x.sweep.len(), MAX_ITEMS)?;
            count(&at("notes"), x.notes.len(), MAX_ITEMS)?;
            if let Some(d) = &x.detail {
                count(&at("detail"), d.len(), MAX_ITEMS)?;
                for (k, v) in d.notes() {
                    bytes(&at(&format!("detail.{k}")), v.len(), MAX_TEXT)?;
                }
            }
            if let Some(e) = &x.end {
                for (k, v) in e.notes() {
                    bytes(&at(&format!("end.{k}")), v.len(), MAX_TEXT)?;
                }
            }
            for k in x.metrics.keys() {
                bytes(&at("metrics key"), k.len(), MAX_NAME)?;
            }
            for (k, v) in &x.notes {
                bytes(&at("notes key"), k.len(), MAX_NAME)?;
                bytes(&at(&format!("notes.{k}")), v.len(), MAX_TEXT)?;
            }
            if let Some(e) = &x.error {
                bytes(&at("error"), e.len(), MAX_TEXT)?;
            }
        }
    }
    for (i, f) in r.findings.iter().enumerate() {
        let at = |s: &str| format!("findings[{i}].{s}");
        if let Some(k) = f.node_rank {
            node(&at("node_rank"), k, n)?;
        }
        if let Some(k) = f.rank {
            rank(&at("rank"), k)?;
        }
        if let Some([a, b]) = f.pair {
            node(&at("pair[0]"), a, n)?;
            node(&at("pair[1]"), b, n)?;
        }
        bytes(&at("host"), f.host.as_ref().map_or(0, String::len), MAX_NAME)?;
        bytes(&at("message"), f.message.len(), MAX_TEXT)?;
        bytes(&at("action"), f.action.as_ref().map_or(0, String::len), MAX_TEXT)?;
        count(&at("evidence"), f.evidence.len(), MAX_ITEMS)?;
        for e in &f.evidence {
            bytes(&at("evidence"), e.len(), MAX_TEXT)?;
        }
    }
    for (i, e) in r.events.iter().enumerate() {
        bytes(&format!("events[{i}].detail"), e.detail.len(), MAX_TEXT)?;
    }
    for (i, v) in r.node_verdicts.iter().enumerate() {
        node(&format!("node_verdicts[{i}].node_rank"), v.node_rank, n)?;
        bytes(&format!("node_verdicts[{i}].host"), v.host.len(), MAX_NAME)?;
        count(&format!("node_verdicts[{i}].codes"), v.codes.len(), MAX_ITEMS)?;
    }
    for (i, &k) in r.faulty_nodes.iter().enumerate() {
        node(&format!("faulty_nodes[{i}]"), k, n)?;
    }
    for (i, p) in r.pair_bandwidth.iter().enumerate() {
        let [a, b] = p.nodes;
        node(&format!("pair_bandwidth[{i}].nodes[0]"), a, n)?;
        node(&format!("pair_bandwidth[{i}].nodes[1]"), b, n)?;
    }
    Ok(())
}

fn node(what: &str, value: usize, len: usize) -> Result<(), InvalidReport> {
    if value >= len {
        return Err(InvalidReport::NodeOutOfRange { what: what.into(), value, len });
    }
    Ok(())
}

fn rank(what: &str, value: usize) -> Result<(), InvalidReport> {
    if value >= MAX_RANKS {
        return Err(InvalidReport::RankOutOfRange { what: what.into(), value });
    }
    Ok(())
}

fn finite(what: &str, value: f64) -> Result<(), InvalidReport> {
    if !value.is_finite() {
        return Err(InvalidReport::NotFinite { what: what.into(), value });
    }
    Ok(())
}

fn count(what: &str, len: usize, max: usize) -> Result<(), InvalidReport> {
    if len > max {
        return Err(InvalidReport::TooMany { what: what.into(), len, max });
    }
    Ok(())
}

fn bytes(what: &str, len: usize, max: usize) -> Result<(), InvalidReport> {
    if len > max {
        return Err(InvalidReport::TooLong { what: what.into(), len, max });
    }
    Ok(())
}
