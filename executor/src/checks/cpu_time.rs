//! Rates per CPU-second on CPU workers. A CPU worker's thread shares the host's cores with
//! whatever else runs there: descheduled, it measures fewer FLOP or bytes per wall second
//! although nothing about its device is slow. The checks whose headline is a rank's own rate
//! (gemm, memory-bandwidth) therefore also divide their work by the CPU time the thread got in
//! the timed window ([`DeviceBackend::thread_cpu_seconds`]); the fleet's baselines judge that
//! figure on CPU workers ([`gpusanity_common::peers::judged_key`]), the peers the wall-clock
//! headline, which is also what the report shows. GPU backends report no CPU time: nothing changes
//! there.

use gpusanity_common::peers::cpu_key;
use gpusanity_common::report::RankResult;

use crate::backend::DeviceBackend;

/// Seconds of CPU time the thread had since `before` (a reading of the same backend), where
/// both readings exist and time went forward.
pub fn since(backend: &dyn DeviceBackend, before: Option<f64>) -> Option<f64> {
    let (before, after) = (before?, backend.thread_cpu_seconds()?);
    Some(after - before).filter(|s| *s > 0.0)
}

/// Inserts `{key}_cpu`, the rate `rate(seconds)` over the `cpu` seconds the thread ran, and
/// `cpu_share`, those seconds over the `wall` seconds of the same window (1.0: the thread had
/// a core to itself), where there is a CPU time.
pub fn insert(r: &mut RankResult, key: &str, wall: f64, cpu: Option<f64>, rate: impl Fn(f64) -> f64) {
    let Some(cpu) = cpu else { return };
    r.metrics.insert(cpu_key(key), rate(cpu));
    if wall > 0.0 {
        r.metrics.insert("cpu_share".into(), cpu / wall);
    }
}
