use super::*;
use crate::host::kernel_log::scan;
use crate::host::{AcsBridge, Level};

const FATAL: &[u32] = &[48, 79, 94, 95, 119, 120];

fn clean() -> HostReadings {
    HostReadings {
        gpus: vec!["0000:3b:00.0".into(), "0000:5d:00.0".into()],
        local_ranks: 2,
        kernel_log: KernelLog::Read { source: "/dev/kmsg".into(), bytes: 0, truncated: false, scan: scan("") },
        shm_bytes: Some(1 << 30),
        memlock: Some(Memlock::Unlimited),
        rdma_devices: vec!["mlx5_0".into()],
        peermem_loaded: true,
        open_kernel_module: false,
        kernel_release: Some("6.8.0-45-generic".into()),
        driver_version: Some("580.95.05".into()),
        acs: vec![AcsBridge { gpu: "0000:3b:00.0".into(), bridge: "0000:3a:00.0".into(), control: Some(0x0001) }],
        acs_unreadable: Vec::new(),
        read_ms: 1.0,
    }
}

fn codes(r: &HostReadings, p: &NodePolicy) -> Vec<(Code, Severity)> {
    judge(r, p, FATAL, 580).into_iter().map(|f| (f.code, f.severity)).collect()
}

#[test]
fn a_clean_host_gives_nothing() {
    assert!(codes(&clean(), &NodePolicy::default()).is_empty());
}

#[test]
fn a_fatal_xid_on_a_job_gpu_fails_and_others_warn_or_are_not_ours() {
    let mut r = clean();
    let log = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n\
               NVRM: Xid (PCI:0000:5d:00): 13, pid=2, Graphics SM Warp Exception\n\
               NVRM: Xid (PCI:0000:99:00): 48, pid=3, DBE\n";
    r.kernel_log = KernelLog::Read { source: "test".into(), bytes: 0, truncated: false, scan: scan(log) };
    let found = judge(&r, &NodePolicy::default(), FATAL, 580);
    let got: Vec<(Code, Severity)> = found.iter().map(|f| (f.code, f.severity)).collect();
    assert_eq!(got, [(Code::NodeKernelXidFatal, Severity::Critical), (Code::NodeKernelXid, Severity::Warning)]);
    assert!(found[0].message.contains("0000:3b:00") && found[0].message.contains("XID 79"), "{}", found[0].message);
    assert!(found[0].evidence[0].contains("fallen off the bus"));
    assert_eq!(found[0].action.as_deref(), xid::action(79));
    // Under a warning policy the fatal one warns; off, nothing.
    let warn = NodePolicy { kernel_xids: Level::Warning, ..NodePolicy::default() };
    assert!(codes(&r, &warn).iter().all(|(_, s)| *s == Severity::Warning));
    let off = NodePolicy { kernel_xids: Level::Off, ..NodePolicy::default() };
    assert!(codes(&r, &off).is_empty());
}

#[test]
fn an_unreadable_log_warns() {
    let mut r = clean();
    r.kernel_log = KernelLog::Unreadable { why: "/dev/kmsg: permission denied".into() };
    assert_eq!(codes(&r, &NodePolicy::default()), [(Code::NodeKernelLogUnreadable, Severity::Warning)]);
}

#[test]
fn each_setting_is_judged_by_its_own_rule() {
    let p = NodePolicy::default();
    let mut r = clean();
    r.shm_bytes = Some(64 << 20);
    r.local_ranks = 4;
    assert_eq!(codes(&r, &p), [(Code::NodeShmSmall, Severity::Critical)]);
    r.local_ranks = 2;
    assert!(codes(&r, &p).is_empty(), "64 MiB holds two ranks");
    r.local_ranks = 1;
    r.shm_bytes = Some(1 << 20);
    assert!(codes(&r, &p).is_empty(), "one rank needs no shared-memory transport");

    let mut r = clean();
    r.memlock = Some(Memlock::Bytes(8 << 20));
    assert_eq!(codes(&r, &p), [(Code::NodeMemlockLimited, Severity::Critical)]);
    r.rdma_devices.clear();
    assert!(codes(&r, &p).is_empty(), "no RDMA device: memlock does not matter");

    let mut r = clean();
    r.peermem_loaded = false;
    assert_eq!(codes(&r, &p), [(Code::NodeNoGpudirectRdma, Severity::Warning)]);
    r.open_kernel_module = true;
    assert!(codes(&r, &p).is_empty(), "DMA-BUF: open module on 6.8");
    r.kernel_release = Some("5.4.0-200-generic".into());
    assert_eq!(codes(&r, &p), [(Code::NodeNoGpudirectRdma, Severity::Warning)]);

    let mut r = clean();
    r.acs[0].control = Some(0x001d);
    assert_eq!(codes(&r, &p), [(Code::NodePcieAcsEnabled, Severity::Warning)]);
    let strict = NodePolicy { pcie_acs: Level::Critical, ..p };
    assert_eq!(codes(&r, &strict), [(Code::NodePcieAcsEnabled, Severity::Critical)]);
    r.gpus.truncate(1);
    r.rdma_devices.clear();
    assert!(codes(&r, &p).is_empty(), "one GPU and no NIC: no peer-to-peer traffic");
    let mut r = clean();
    r.acs_unreadable = vec!["0000:3a:00.0".into()];
    assert_eq!(codes(&r, &p), [(Code::NodePcieAcsUnreadable, Severity::Warning)]);

    let mut r = clean();
    r.driver_version = Some("570.124.06".into());
    assert_eq!(codes(&r, &p), [(Code::NodeDriverTooOld, Severity::Critical)]);
}
