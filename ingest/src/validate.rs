//! Validation of job events: anything malformed gets one clear reason (for the dead letter).

use gpusanity_common::wire::job::{JobEvent, JobEventBody, JobNode, JOB_EVENT_TYPES};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_common::Settings;
use thiserror::Error;

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
    let ev: JobEvent =
        serde_json::from_value(v).map_err(|e| Reject::Malformed { kind: kind.clone(), why: e.to_string() })?;
    for (name, value) in [("event_id", &ev.event_id), ("job_id", &ev.job_id)] {
        if value.trim().is_empty() {
            return Err(Reject::Malformed { kind: kind.clone(), why: format!("empty `{name}`") });
        }
    }
    match &ev.body {
        JobEventBody::JobResourcesAllocated(a) => check_nodes(&a.nodes)?,
        JobEventBody::JobRestarted { nodes: Some(n), .. } => check_nodes(n)?,
        _ => {}
    }
    Ok(ev)
}

/// The settings of an allocation, validated with the same parser as `gpusanity check`.
pub fn settings(args: &str) -> Result<Settings, Reject> {
    Settings::from_args_str(args).map_err(|e| Reject::BadSettings(e.to_string()))
}

fn check_nodes(nodes: &[JobNode]) -> Result<(), Reject> {
    let mut seen = std::collections::HashSet::new();
    for n in nodes {
        if n.name.trim().is_empty() {
            return Err(Reject::BadNodes("a node with an empty name".into()));
        }
        if !seen.insert(n.name.as_str()) {
            return Err(Reject::BadNodes(format!("node `{}` listed twice", n.name)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn settings_use_the_check_parser() {
        assert!(settings("--sanity-check-max-time=0.5").is_ok());
        assert!(matches!(settings("--sanity-check-timing=Sometimes"), Err(Reject::BadSettings(_))));
        assert!(matches!(settings("--micro-benchmarks=warp-drive"), Err(Reject::BadSettings(_))));
    }
}
