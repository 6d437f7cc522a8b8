//! What operators see of a running service: its metrics (`GET /metrics`, [`metrics`]), its
//! liveness and readiness (`GET /health`, `GET /ready`, [`health`]), and the format of its log.

pub mod health;
pub mod metrics;

use serde::{Deserialize, Serialize};

/// `[log]`: the log's format (`--log-format` and GPUSANITY_LOG_FORMAT win).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (time, level, target, message, fields).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format `{other}`: expected json or text")),
        }
    }
}

/// The `[log] format` of the configuration file at `path`, if it can be read (a file that
/// cannot is reported when the command loads it).
pub fn log_format_of(path: &std::path::Path) -> Option<LogFormat> {
    crate::ServiceConfig::load(Some(path)).ok().map(|c| c.log.format)
}
