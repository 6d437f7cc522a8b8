//! The diagnosis's own settings beside the checks' (`diagnosis.KEY=VALUE`): their keys, and the
//! stall time's default and limit.

/// The `--check-param` keys that belong to no check.
pub const DIAGNOSIS_PARAM_KEYS: &[&str] = &["diagnosis.slow-fraction", "diagnosis.stall-s"];

/// The default stall time: far above any single operation of the checks, far below the
/// default per-test limit (6 min).
pub const DEFAULT_STALL_S: u64 = 30;
/// The longest stall time accepted (a day).
pub const MAX_STALL_S: u64 = 86_400;

/// [`DEFAULT_STALL_S`], for a stored configuration without a stall time.
pub fn default_stall_s() -> u64 {
    DEFAULT_STALL_S
}
