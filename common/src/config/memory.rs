//! Whether a run's checks fit in memory: each one's need per rank under a configuration, from
//! its descriptor (`Descriptor::memory`, stated with the figures of [`super::buffers`]), and the
//! largest of them, so that a size that cannot fit is refused before any worker starts, saying
//! how much it needs, instead of ending as an out-of-memory crash that would read as a node
//! fault.

pub use super::buffers::Need;
use crate::checks::CheckConfigs;
use crate::kinds::DeviceKind;
use crate::registry::CheckId;

/// What `check` needs per rank under `configs` (None: not estimated), from its descriptor.
pub fn need(configs: &CheckConfigs, check: CheckId, device: DeviceKind) -> Option<Need> {
    check.descriptor().memory.map(|need| need(configs, device))
}

/// The largest need of any of `checks` (they run one after the other).
pub fn largest(configs: &CheckConfigs, checks: &[CheckId], device: DeviceKind) -> Option<(CheckId, Need)> {
    checks.iter().filter_map(|c| need(configs, *c, device).map(|n| (*c, n))).max_by_key(|(_, n)| n.device.max(n.host))
}

/// `bytes` for people: GiB with one decimal, or "more than 16 EiB" for an overflow.
pub fn gib(bytes: u64) -> String {
    if bytes == u64::MAX {
        "more than 16 EiB".into()
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_grow_with_the_sizes_and_overflow_saturates() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cuda);
        let g = need(&c, CheckId::Gemm, DeviceKind::Cuda).unwrap();
        assert_eq!(g.device, 3 * 8192 * 8192 * 2);
        c.gemm.size = 65_536;
        assert_eq!(need(&c, CheckId::Gemm, DeviceKind::Cuda).unwrap().device, 3 * (1u64 << 32) * 2);
        c.all_reduce.max_bytes = u64::MAX / 2 + 1;
        let ar = need(&c, CheckId::AllReduce, DeviceKind::Cuda).unwrap();
        assert_eq!(ar.device, u64::MAX);
        assert_eq!(largest(&c, &[CheckId::Gemm, CheckId::AllReduce], DeviceKind::Cuda).unwrap().0, CheckId::AllReduce);
        assert_eq!(need(&c, CheckId::MiniGpt, DeviceKind::Cuda), None);
        assert_eq!(gib(u64::MAX), "more than 16 EiB");
        assert_eq!(gib(3 << 30), "3.0 GiB");
        let mb = need(&c, CheckId::MemoryBandwidth, DeviceKind::Cuda).unwrap();
        assert_eq!(mb, Need { device: 8 << 30, host: 0 });
        c.memory_bandwidth.size = u64::MAX / 2 + 1;
        assert_eq!(need(&c, CheckId::MemoryBandwidth, DeviceKind::Cpu).unwrap().host, u64::MAX);
        let hb = need(&c, CheckId::HostBandwidth, DeviceKind::Cuda).unwrap();
        assert_eq!(hb, Need { device: 256 << 20, host: 256 << 20 });
        assert_eq!(need(&c, CheckId::RdmaPorts, DeviceKind::Cuda), None);
        // The collective sweeps take their largest message, each from its own configuration.
        c.reduce_scatter.max_bytes = 1 << 20;
        let rs = need(&c, CheckId::ReduceScatter, DeviceKind::Cpu).unwrap();
        assert_eq!(rs, Need { device: 0, host: 3 << 20 });
        assert_ne!(need(&c, CheckId::AllGather, DeviceKind::Cpu), Some(rs));
        c.multi_all_reduce.world_streams = usize::MAX;
        assert_eq!(need(&c, CheckId::MultiAllReduce, DeviceKind::Cuda).unwrap().device, u64::MAX);
    }

    #[test]
    fn every_check_sized_by_its_configuration_states_its_need() {
        let c = CheckConfigs::defaults(DeviceKind::Cuda);
        let estimated: Vec<CheckId> =
            CheckId::ALL.into_iter().filter(|id| need(&c, *id, DeviceKind::Cuda).is_some()).collect();
        assert_eq!(
            estimated,
            [
                CheckId::Gemm,
                CheckId::MemoryBandwidth,
                CheckId::HostBandwidth,
                CheckId::AllReduce,
                CheckId::AllToAll,
                CheckId::AllGather,
                CheckId::ReduceScatter,
                CheckId::MultiAllReduce,
                CheckId::MatmulAllReduceOverlap,
            ]
        );
    }
}
