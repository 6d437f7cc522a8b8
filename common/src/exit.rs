//! Documented process exit codes of `gpusanity check` (also listed in the README).

/// Exit status of `gpusanity check` when it does not hand over to COMMAND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    /// All selected checks passed (and no COMMAND was given), or checks were skipped by the
    /// timing policy.
    Passed = 0,
    /// A check found a problem: CheckFailed.
    CheckFailed = 1,
    /// Bad input: unknown check, malformed settings, unreachable master, missing GPU...
    Usage = 2,
    /// A test or the whole check overran its time limit under `MarkJobFail` (or a `KeepJobHang`
    /// hold was ended by SIGTERM).
    TimedOut = 3,
    /// An internal error of gpusanity itself (a bug, or an I/O failure writing the report).
    Internal = 4,
    /// COMMAND could not be started after a pass.
    ExecFailed = 127,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}
