//! Validation of job events and agent reports: anything malformed gets one clear reason (for
//! the dead letter). Names and ids are one short printable line; no string anywhere holds a
//! NUL (PostgreSQL cannot store one in text); lengths are bounded.

use crate::text::{check_name, check_text, first_nul, TextError, MAX_TEXT};
use gpusanity_common::wire::agent::{AgentReport, ReportBody};
use gpusanity_common::wire::job::{JobEvent, JobEventBody, JobNode, RestartReason, JOB_EVENT_TYPES};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_common::Settings;
use thiserror::Error;

use gpusanity_common::config::health::MAX_GPUS_PER_NODE;

/// The most nodes one job event may list.
pub const MAX_NODES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Reject {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON object")]
    NotObject,
    #[error("unknown event type `{0}` (known: {known})", known = JOB_EVENT_TYPES.join(", "))]
    UnknownType(String),
    #[error("missing event type (field `type`)")]
    MissingType,
    #[error("unsupported version {0} (this service reads version {WIRE_VERSION})")]
    Version(u64),
    #[error("malformed {kind}: {why}")]
    Malformed { kind: String, why: String },
    #[error("bad SanityCheckArgs: {0}")]
    BadSettings(String),
    #[error("bad nodes: {0}")]
    BadNodes(String),
    #[error("`{0}` holds a NUL character")]
    Nul(String),
    #[error("bad `{field}`: {why}")]
    BadText { field: String, why: TextError },
    #[error("JobRestarted for job `{0}`, which the service has never seen allocated (its settings are unknown)")]
    UnknownJob(String),
}

/// Parses and checks the shape of one job event.
pub fn parse(bytes: &[u8]) -> Result<JobEvent, Reject> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| Reject::NotJson(e.to_string()))?;
    let obj = v.as_object().ok_or(Reject::NotObject)?;
    let kind = match obj.get("type") {
        Some(serde_json::Value::String(t)) => t.clone(),
        Some(other) => return Err(Reject::UnknownType(other.to_string())),
        None => return Err(Reject::MissingType),
    };
    if !JOB_EVENT_TYPES.contains(&kind.as_str()) {
        return Err(Reject::UnknownType(kind));
    }
    match obj.get("version").and_then(|v| v.as_u64()) {
        Some(n) if n == u64::from(WIRE_VERSION) => {}
        Some(n) => return Err(Reject::Version(n)),
        None => return Err(Reject::Malformed { kind, why: "missing or non-integer `version`".into() }),
    }
    if let Some(path) = first_nul(&v) {
        return Err(Reject::Nul(path.trim_start_matches('.').to_string()));
    }
    let ev: JobEvent =
        serde_json::from_value(v).map_err(|e| Reject::Malformed { kind: kind.clone(), why: e.to_string() })?;
    for (name, value) in [("event_id", &ev.event_id), ("job_id", &ev.job_id)] {
        if value.trim().is_empty() {
            return Err(Reject::Malformed { kind: kind.clone(), why: format!("empty `{name}`") });
        }
    }
    name("event_id", &ev.event_id)?;
    name("job_id", &ev.job_id)?;
    line("workspace_id", &ev.workspace_id)?;
    match &ev.body {
        JobEventBody::JobResourcesAllocated(a) => {
            if let Some(f) = &a.framework {
                line("framework", f)?;
            }
            text("settings.SanityCheckArgs", &a.settings.sanity_check_args)?;
            check_nodes(&a.nodes)?;
        }
        JobEventBody::JobRestarted { reason, nodes, .. } => {
            if let RestartReason::Other(r) = reason {
                line("reason", r)?;
            }
            if let Some(n) = nodes {
                check_nodes(n)?;
            }
        }
        JobEventBody::JobStopped { reason } => text("reason", reason)?,
    }
    Ok(ev)
}

/// A name or id (not blank, one printable line, at most [`MAX_NAME`] bytes).
fn name(field: &str, value: &str) -> Result<(), Reject> {
    check_name(value).map_err(|why| Reject::BadText { field: field.into(), why })
}

/// Like [`name`], but it may be empty.
fn line(field: &str, value: &str) -> Result<(), Reject> {
    if value.is_empty() {
        return Ok(());
    }
    name(field, value)
}

/// Free text: no NUL, at most [`MAX_TEXT`] bytes.
fn text(field: &str, value: &str) -> Result<(), Reject> {
    check_text(value, MAX_TEXT).map_err(|why| Reject::BadText { field: field.into(), why })
}

/// Checks the names, ids and text of an agent report before it is handled; a refused report
/// becomes a dead letter. The report.json node 0 sends may hold any text but no NUL.
pub fn agent_report(r: &AgentReport) -> Result<(), Reject> {
    name("node", &r.node)?;
    name("agent_id", &r.agent_id)?;
    match &r.body {
        ReportBody::Heartbeat { address, run_id, .. } => {
            line("address", address)?;
            if let Some(id) = run_id {
                name("run_id", id)?;
            }
        }
        ReportBody::Started { run_id, .. } => name("run_id", run_id)?,
        ReportBody::ReportChunk(c) => name("run_id", &c.run_id)?,
        ReportBody::Result(res) => {
            name("run_id", &res.run_id)?;
            if let Some(e) = &res.error {
                text("error", e)?;
            }
            if let Some(report) = &res.report {
                let v = serde_json::to_value(report)
                    .map_err(|e| Reject::Malformed { kind: "Result".into(), why: e.to_string() })?;
                if let Some(path) = first_nul(&v) {
                    return Err(Reject::Nul(format!("report{path}")));
                }
            }
        }
    }
    Ok(())
}

/// The settings of an allocation, validated with the same parser as `gpusanity check`.
pub fn settings(args: &str) -> Result<Settings, Reject> {
    Settings::from_args_str(args).map_err(|e| Reject::BadSettings(e.to_string()))
}

fn check_nodes(nodes: &[JobNode]) -> Result<(), Reject> {
    if nodes.len() > MAX_NODES {
        return Err(Reject::BadNodes(format!("{} nodes (at most {MAX_NODES})", nodes.len())));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.name.trim().is_empty() {
            return Err(Reject::BadNodes("a node with an empty name".into()));
        }
        name(&format!("nodes[{i}].name"), &n.name)?;
        line(&format!("nodes[{i}].address"), &n.address)?;
        if !seen.insert(n.name.as_str()) {
            return Err(Reject::BadNodes(format!("node `{}` listed twice", n.name)));
        }
        check_gpu_ids(n)?;
    }
    Ok(())
}

/// A node's `gpu_ids` (each already parsed): as many as its `gpus`, one form, none twice.
fn check_gpu_ids(n: &JobNode) -> Result<(), Reject> {
    if n.gpu_ids.is_empty() {
        return Ok(());
    }
    let bad = |why: String| Err(Reject::BadNodes(format!("node `{}`: gpu_ids {why}", n.name)));
    if n.gpu_ids.len() as u64 > MAX_GPUS_PER_NODE {
        return bad(format!("names {} GPUs (at most {MAX_GPUS_PER_NODE})", n.gpu_ids.len()));
    }
    if n.gpu_ids.len() != n.gpus as usize {
        return bad(format!("names {} GPU(s) but gpus is {}", n.gpu_ids.len(), n.gpus));
    }
    if let Some(other) = n.gpu_ids.iter().find(|g| g.form() != n.gpu_ids[0].form()) {
        return bad(format!("mixes forms ({} and {}): one form per node", n.gpu_ids[0].form(), other.form()));
    }
    let mut ids = std::collections::HashSet::new();
    if let Some(twice) = n.gpu_ids.iter().find(|g| !ids.insert(*g)) {
        return bad(format!("names `{twice}` twice"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::MAX_NAME;

    fn alloc(args: &str) -> String {
        format!(
            r#"{{"version":1,"type":"JobResourcesAllocated","event_id":"e1","job_id":"j1","workspace_id":"w","attempt":0,
               "nodes":[{{"name":"a","address":"10.0.0.1","gpus":8}}],"settings":{{"EnableSanityCheck":true,"SanityCheckArgs":"{args}"}}}}"#
        )
    }

    #[test]
    fn accepts_a_valid_allocation() {
        let ev = parse(alloc("--sanity-check-max-time=1").as_bytes()).unwrap();
        assert_eq!(ev.job_id, "j1");
        assert!(matches!(ev.body, JobEventBody::JobResourcesAllocated(_)));
    }

    #[test]
    fn rejects_with_a_reason() {
        assert!(matches!(parse(b"{not json"), Err(Reject::NotJson(_))));
        assert!(matches!(parse(b"[1]"), Err(Reject::NotObject)));
        let unknown = r#"{"version":1,"type":"JobExploded","event_id":"e","job_id":"j","workspace_id":"w"}"#;
        assert_eq!(parse(unknown.as_bytes()), Err(Reject::UnknownType("JobExploded".into())));
        let no_nodes = r#"{"version":1,"type":"JobResourcesAllocated","event_id":"e","job_id":"j","workspace_id":"w","settings":{}}"#;
        assert!(matches!(parse(no_nodes.as_bytes()), Err(Reject::Malformed { .. })));
        let v2 = alloc("").replace(r#""version":1"#, r#""version":2"#);
        assert_eq!(parse(v2.as_bytes()), Err(Reject::Version(2)));
        let twice = alloc("").replace(r#"}],"settings""#, r#"},{"name":"a","address":"x","gpus":1}],"settings""#);
        assert!(matches!(parse(twice.as_bytes()), Err(Reject::BadNodes(_))));
    }

    #[test]
    fn gpu_ids_are_parsed_counted_of_one_form_and_never_twice() {
        let with =
            |ids: &str, gpus: u32| alloc("").replace(r#""gpus":8}"#, &format!(r#""gpus":{gpus},"gpu_ids":{ids}}}"#));
        let ok = parse(with(r#"["4","5","6","7"]"#, 4).as_bytes()).unwrap();
        let JobEventBody::JobResourcesAllocated(a) = ok.body else { panic!() };
        assert_eq!(a.nodes[0].gpu_ids.iter().map(|g| g.to_string()).collect::<Vec<_>>(), ["4", "5", "6", "7"]);
        let uuid = r#"["GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99"]"#;
        assert!(parse(with(uuid, 1).as_bytes()).is_ok());
        let why = |ids: &str, gpus: u32| parse(with(ids, gpus).as_bytes()).unwrap_err().to_string();
        assert!(why(r#"["4","4"]"#, 2).contains("names `4` twice"), "{}", why(r#"["4","4"]"#, 2));
        assert!(why(r#"["4","5"]"#, 3).contains("names 2 GPU(s) but gpus is 3"));
        assert!(why(&format!(r#"["4",{}]"#, &uuid[1..uuid.len() - 1]), 2).contains("mixes forms"));
        let e = why(r#"["GPU-nope"]"#, 1);
        assert!(e.contains("GPU-nope") && e.starts_with("malformed"), "{e}");
        assert!(why(r#"["0000:3b:00.0","00000000:3B:00.0"]"#, 2).contains("twice"));
        assert!(why(r#"[7]"#, 1).starts_with("malformed"));
    }

    #[test]
    fn rejects_nul_control_characters_and_long_names() {
        let nul = alloc("").replace(r#""job_id":"j1""#, r#""job_id":"j\u00001""#);
        let r = parse(nul.as_bytes()).expect_err("a NUL");
        assert_eq!(r, Reject::Nul("job_id".into()));
        assert_eq!(r.to_string(), "`job_id` holds a NUL character");
        let node = alloc("").replace(r#""name":"a""#, r#""name":"a\u0000""#);
        assert_eq!(parse(node.as_bytes()), Err(Reject::Nul("nodes[0].name".into())));
        let args = alloc("--sanity-check-max-time=1\\u0000");
        assert_eq!(parse(args.as_bytes()), Err(Reject::Nul("settings.SanityCheckArgs".into())));
        let nl = alloc("").replace(r#""job_id":"j1""#, r#""job_id":"j\n1""#);
        let r = parse(nl.as_bytes()).expect_err("a line break");
        assert_eq!(r.to_string(), "bad `job_id`: holds the control character U+000A (byte 1)");
        let ws = alloc("").replace(r#""workspace_id":"w""#, r#""workspace_id":"w\u001b[31m""#);
        assert!(matches!(parse(ws.as_bytes()), Err(Reject::BadText { field, .. }) if field == "workspace_id"));
        let long = alloc("").replace(r#""job_id":"j1""#, &format!(r#""job_id":"{}""#, "j".repeat(MAX_NAME + 1)));
        assert!(matches!(parse(long.as_bytes()), Err(Reject::BadText { why: TextError::TooLong { .. }, .. })));
        let stop =
            r#"{"version":1,"type":"JobStopped","event_id":"e","job_id":"j","workspace_id":"w","reason":"x\u0000"}"#;
        assert_eq!(parse(stop.as_bytes()), Err(Reject::Nul("reason".into())));
    }

    #[test]
    fn agent_reports_are_checked_too() {
        let beat = |node: &str, run: Option<&str>| AgentReport {
            version: 1,
            node: node.into(),
            agent_id: "a1".into(),
            at: chrono::Utc::now(),
            body: ReportBody::Heartbeat {
                address: "10.0.0.1".into(),
                run_id: run.map(str::to_string),
                elapsed_s: None,
            },
        };
        assert_eq!(agent_report(&beat("node-a", Some("r1"))), Ok(()));
        assert!(matches!(agent_report(&beat("node\0a", None)), Err(Reject::BadText { field, .. }) if field == "node"));
        assert!(agent_report(&beat("node-a", Some("r\u{1}"))).is_err());
        let result = |error: &str| AgentReport {
            body: ReportBody::Result(gpusanity_common::wire::agent::NodeResult {
                run_id: "r1".into(),
                node_rank: 0,
                exit_code: Some(4),
                report: None,
                report_chunks: None,
                error: Some(error.into()),
            }),
            ..beat("node-a", None)
        };
        assert_eq!(agent_report(&result("two\nlines")), Ok(()));
        let r = agent_report(&result("bad\0")).expect_err("a NUL");
        assert_eq!(r.to_string(), "bad `error`: holds a NUL character (byte 3)");
    }

    #[test]
    fn settings_use_the_check_parser() {
        assert!(settings("--sanity-check-max-time=0.5").is_ok());
        assert!(matches!(settings("--sanity-check-timing=Sometimes"), Err(Reject::BadSettings(_))));
        assert!(matches!(settings("--micro-benchmarks=warp-drive"), Err(Reject::BadSettings(_))));
    }
}
