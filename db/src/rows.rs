//! The rows of jobs and runs as stored, and the columns a run is read by: what the queries of
//! [`crate::runs`], [`crate::bulk`] and [`crate::lease`] share.

use gpusanity_common::wire::job::JobNode;
use serde::{Deserialize, Serialize};

use crate::column::{Flag, JsonText};

/// The state of a run the service stores (`runs.state`): checking (or held by KeepJobHang), then
/// passed or failed, or cancelled when its job stopped or was reallocated. The launcher's own
/// states are `gpusanity_common::events::CheckState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ServiceRunState {
    Checking,
    CheckPassed,
    CheckFailed,
    CheckCancelled,
}

impl ServiceRunState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceRunState::Checking => "Checking",
            ServiceRunState::CheckPassed => "CheckPassed",
            ServiceRunState::CheckFailed => "CheckFailed",
            ServiceRunState::CheckCancelled => "CheckCancelled",
        }
    }

    /// The stored name; an unknown one reads as `Checking` (the state a person can resolve).
    fn parse(s: &str) -> ServiceRunState {
        match s {
            "CheckPassed" => ServiceRunState::CheckPassed,
            "CheckFailed" => ServiceRunState::CheckFailed,
            "CheckCancelled" => ServiceRunState::CheckCancelled,
            _ => ServiceRunState::Checking,
        }
    }
}

impl From<String> for ServiceRunState {
    fn from(s: String) -> ServiceRunState {
        ServiceRunState::parse(&s)
    }
}

/// The job as its last allocation described it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct JobRow {
    pub job_id: String,
    pub workspace_id: String,
    pub attempt: i64,
    pub framework: Option<String>,
    #[sqlx(try_from = "JsonText<Vec<JobNode>>")]
    pub nodes: Vec<JobNode>,
    #[sqlx(try_from = "Flag")]
    pub enable_check: bool,
    pub check_args: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct RunRow {
    pub run_id: String,
    pub job_id: String,
    pub workspace_id: String,
    pub attempt: i64,
    pub cause_event_id: String,
    /// The job's nodes: `{name, address, gpus}` each.
    #[schema(value_type = Vec<Object>)]
    #[sqlx(try_from = "JsonText<Vec<JobNode>>")]
    pub nodes: Vec<JobNode>,
    pub check_args: String,
    /// The validated settings, as JSON.
    #[schema(value_type = Object)]
    #[sqlx(try_from = "JsonText<serde_json::Value>")]
    pub settings: serde_json::Value,
    #[sqlx(try_from = "String")]
    pub state: ServiceRunState,
    /// A KeepJobHang overrun waiting for a person.
    #[sqlx(try_from = "Flag")]
    pub held: bool,
    pub created_at: i64,
    pub deadline_at: i64,
    pub finished_at: Option<i64>,
    pub summary: String,
}

pub(crate) const RUN_COLUMNS: &str =
    "run_id, job_id, workspace_id, attempt, cause_event_id, nodes, check_args, settings, state, held, created_at, deadline_at, finished_at, summary";
