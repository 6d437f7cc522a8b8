//! Sizes that cannot fit are refused before any worker starts (exit 2), saying how much they
//! need and how much there is: on a GPU node each device's memory and the host's available
//! memory for all local workers; on CPU workers the host's available memory for all of them.

use gpusanity_common::config::memory::{gib, largest};
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::DeviceKind;

use super::UsageError;

/// `MemAvailable` of /proc/meminfo, in bytes (None where it cannot be read).
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks that the largest selected check fits on this node with `nproc` workers.
pub fn check_fits(
    configs: &CheckConfigs,
    checks: &[CheckId],
    device: DeviceKind,
    nproc: usize,
) -> Result<(), UsageError> {
    let Some((check, need)) = largest(configs, checks, device) else { return Ok(()) };
    let hint = "lower its sizes with --check-param (gpusanity list shows them)";
    if device == DeviceKind::Cuda && need.device > 0 {
        let memory = crate::backend::cuda::probe_memory().unwrap_or_default();
        if let Some(have) = memory.iter().take(nproc).min().copied() {
            if need.device > have {
                return Err(UsageError(format!(
                    "{check} needs {} of GPU memory per rank at its sizes, and this node's smallest GPU has {}: {hint}",
                    gib(need.device),
                    gib(have)
                )));
            }
        }
    }
    if let Some(have) = host_available() {
        let total = need.host.saturating_mul(nproc as u64);
        if total > have {
            return Err(UsageError(format!(
                "{check} needs {} of host memory on this node ({} per rank, {nproc} rank(s)) at its sizes, and {} is available: {hint}",
                gib(total),
                gib(need.host),
                gib(have)
            )));
        }
    }
    Ok(())
}
