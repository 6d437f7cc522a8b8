//! The seven check settings of a job, with their exact names and defaults, and the
//! one parser that reads them from a `SanityCheckArgs` string or from individual flags.
//!
//! A job carries them as `EnableSanityCheck` and one `SanityCheckArgs` string, for example
//! `--sanity-check-timing=AfterJobFaultTolerant --sanity-check-timeout-ops=MarkJobFail`.
//! Both `--name=value` and `--name value` are accepted; values may be shell-quoted.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::checks;
use crate::registry::{CheckGroup, CheckId};

/// When the check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Timing {
    /// Check before every start of the job, restarts included.
    #[default]
    BeforeJobRunning,
    /// Check only when this start is a fault-tolerant restart.
    AfterJobFaultTolerant,
}

/// What an overrun of the whole check's time does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum TimeoutOps {
    /// End the check: CheckFailed.
    #[default]
    MarkJobFail,
    /// Stay in Checking until a person resolves it.
    KeepJobHang,
}

macro_rules! named_enum {
    ($t:ty, $what:literal, $($v:ident),+) => {
        impl FromStr for $t {
            type Err = SettingsError;
            fn from_str(s: &str) -> Result<Self, SettingsError> {
                match s {
                    $(stringify!($v) => Ok(<$t>::$v),)+
                    _ => Err(SettingsError::BadValue {
                        option: $what.into(),
                        value: s.into(),
                        expected: concat!("one of:" $(, " ", stringify!($v))+).into(),
                    }),
                }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self { $(<$t>::$v => f.write_str(stringify!($v)),)+ }
            }
        }
    };
}
named_enum!(Timing, "--sanity-check-timing", BeforeJobRunning, AfterJobFaultTolerant);
named_enum!(TimeoutOps, "--sanity-check-timeout-ops", MarkJobFail, KeepJobHang);

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SettingsError {
    #[error("unknown option `{0}` (known: {known})", known = OPTIONS.join(", "))]
    UnknownOption(String),
    #[error("option `{0}` needs a value")]
    MissingValue(String),
    #[error("bad value `{value}` for {option}: expected {expected}")]
    BadValue { option: String, value: String, expected: String },
    #[error("unknown check `{name}` in {option} (known {group} checks: {known})")]
    UnknownCheck { option: String, name: String, group: CheckGroup, known: String },
    #[error("check `{name}` is listed twice in {option}: each check runs once")]
    DuplicateCheck { option: String, name: String },
    #[error("no check selected: --micro-benchmarks and --model-benchmarks are both empty")]
    NothingSelected,
    #[error("malformed SanityCheckArgs: {0}")]
    Malformed(String),
}

/// The names of the seven options, spelled as jobs give them.
pub const OPTIONS: [&str; 7] = [
    "--sanity-check-timing",
    "--sanity-check-max-time",
    "--sanity-check-timeout-ops",
    "--sanity-check-envs",
    "--sanity-check-timeout-per-test",
    "--micro-benchmarks",
    "--model-benchmarks",
];

/// The seven settings of a check run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub timing: Timing,
    /// Minutes for the whole check.
    pub max_time_minutes: f64,
    pub timeout_ops: TimeoutOps,
    /// Environment for the check processes (not for the job's COMMAND).
    pub envs: Vec<(String, String)>,
    /// Minutes for each test.
    pub timeout_per_test_minutes: f64,
    pub micro_benchmarks: Vec<CheckId>,
    pub model_benchmarks: Vec<CheckId>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timing: Timing::BeforeJobRunning,
            max_time_minutes: 30.0,
            timeout_ops: TimeoutOps::MarkJobFail,
            envs: Vec::new(),
            timeout_per_test_minutes: 6.0,
            micro_benchmarks: vec![CheckId::Gemm, CheckId::AllReduce, CheckId::GpuHealth],
            model_benchmarks: Vec::new(),
        }
    }
}

impl Settings {
    /// Parses a `SanityCheckArgs` string on top of the defaults and validates the result.
    pub fn from_args_str(args: &str) -> Result<Settings, SettingsError> {
        let mut s = Settings::default();
        s.apply_args_str(args)?;
        s.validate()?;
        Ok(s)
    }

    /// Applies every option of a `SanityCheckArgs` string to `self` (later ones win).
    pub fn apply_args_str(&mut self, args: &str) -> Result<(), SettingsError> {
        let tokens =
            shlex::split(args).ok_or_else(|| SettingsError::Malformed(format!("unbalanced quotes in `{args}`")))?;
        let mut it = tokens.into_iter();
        while let Some(tok) = it.next() {
            let Some(opt) = tok.strip_prefix("--") else {
                return Err(SettingsError::Malformed(format!("`{tok}` is not an option (options start with --)")));
            };
            let (name, value) = match opt.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => {
                    let name = opt.to_string();
                    if !OPTIONS.contains(&format!("--{name}").as_str()) {
                        return Err(SettingsError::UnknownOption(format!("--{name}")));
                    }
                    let v = it.next().ok_or_else(|| SettingsError::MissingValue(format!("--{name}")))?;
                    (name, v)
                }
            };
            self.apply(&format!("--{name}"), &value)?;
        }
        Ok(())
    }

    /// Applies one option given by its full name (`--sanity-check-max-time`) and value.
    pub fn apply(&mut self, option: &str, value: &str) -> Result<(), SettingsError> {
        match option {
            "--sanity-check-timing" => self.timing = value.parse()?,
            "--sanity-check-max-time" => self.max_time_minutes = parse_minutes(option, value)?,
            "--sanity-check-timeout-ops" => self.timeout_ops = value.parse()?,
            "--sanity-check-envs" => self.envs = parse_envs(value)?,
            "--sanity-check-timeout-per-test" => self.timeout_per_test_minutes = parse_minutes(option, value)?,
            "--micro-benchmarks" => self.micro_benchmarks = parse_checks(option, CheckGroup::Micro, value)?,
            "--model-benchmarks" => self.model_benchmarks = parse_checks(option, CheckGroup::Model, value)?,
            other => return Err(SettingsError::UnknownOption(other.to_string())),
        }
        Ok(())
    }

    /// Checks that every selected check exists in its group, is available and is listed once,
    /// and that at least one is selected.
    pub fn validate(&self) -> Result<(), SettingsError> {
        for (option, group, names) in [
            ("--micro-benchmarks", CheckGroup::Micro, &self.micro_benchmarks),
            ("--model-benchmarks", CheckGroup::Model, &self.model_benchmarks),
        ] {
            for (i, id) in names.iter().enumerate() {
                if names[..i].contains(id) {
                    return Err(SettingsError::DuplicateCheck { option: option.into(), name: id.to_string() });
                }
                let info = id.descriptor();
                if !info.listed || info.group != group {
                    return Err(unknown_check(option, group, id.as_str()));
                }
            }
        }
        if self.micro_benchmarks.is_empty() && self.model_benchmarks.is_empty() {
            return Err(SettingsError::NothingSelected);
        }
        Ok(())
    }

    /// The selected checks in run order: micro-benchmarks, then model benchmarks.
    pub fn selected_checks(&self) -> Vec<CheckId> {
        self.micro_benchmarks.iter().chain(&self.model_benchmarks).copied().collect()
    }

    pub fn max_time(&self) -> Duration {
        Duration::from_secs_f64(self.max_time_minutes * 60.0)
    }

    pub fn timeout_per_test(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_per_test_minutes * 60.0)
    }

    /// The settings written back as one `SanityCheckArgs` string.
    pub fn to_args_string(&self) -> String {
        let envs: Vec<String> = self.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let names = |ids: &[CheckId]| ids.iter().map(|id| id.as_str()).collect::<Vec<_>>().join(",");
        let parts = [
            format!("--sanity-check-timing={}", self.timing),
            format!("--sanity-check-max-time={}", self.max_time_minutes),
            format!("--sanity-check-timeout-ops={}", self.timeout_ops),
            format!("--sanity-check-envs={}", envs.join(",")),
            format!("--sanity-check-timeout-per-test={}", self.timeout_per_test_minutes),
            format!("--micro-benchmarks={}", names(&self.micro_benchmarks)),
            format!("--model-benchmarks={}", names(&self.model_benchmarks)),
        ];
        parts
            .iter()
            .map(|p| shlex::try_quote(p).map(|q| q.into_owned()).unwrap_or_else(|_| p.clone()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn parse_minutes(option: &str, value: &str) -> Result<f64, SettingsError> {
    let bad = || SettingsError::BadValue {
        option: option.into(),
        value: value.into(),
        expected: "a positive number of minutes (fractions allowed, e.g. 0.5)".into(),
    };
    let m: f64 = value.trim().parse().map_err(|_| bad())?;
    // Upper bound: one week, so that Duration arithmetic can never overflow.
    if !m.is_finite() || m <= 0.0 || m > 7.0 * 24.0 * 60.0 {
        return Err(bad());
    }
    Ok(m)
}

/// Parses a comma list of check names given to `option` (which selects checks of `group`);
/// whether each belongs to the group is [`Settings::validate`]'s question.
fn parse_checks(option: &str, group: CheckGroup, value: &str) -> Result<Vec<CheckId>, SettingsError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| name.parse::<CheckId>().map_err(|_| unknown_check(option, group, name)))
        .collect()
}

fn unknown_check(option: &str, group: CheckGroup, name: &str) -> SettingsError {
    SettingsError::UnknownCheck {
        option: option.into(),
        name: name.into(),
        group,
        known: checks::names(group).join(", "),
    }
}

/// Parses `k1=v1,k2=v2`. Keys must be environment variable names; values may be empty.
pub fn parse_envs(value: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || SettingsError::BadValue {
            option: "--sanity-check-envs".into(),
            value: item.into(),
            expected: "KEY=VALUE items separated by commas, KEY made of letters, digits and _".into(),
        };
        let (k, v) = item.split_once('=').ok_or_else(bad)?;
        let valid_key = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_key {
            return Err(bad());
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
