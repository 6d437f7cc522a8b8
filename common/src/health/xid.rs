//! Which XIDs are fatal: an XID in this table seen during the check fails the GPU
//! (`GPU_HEALTH_XID_FATAL`); any other XID is reported as a warning (`GPU_HEALTH_XID`). The
//! table is the default of `gpu-health.fatal-xids`, which replaces it.
//!
//! Source: NVIDIA's XID catalogue ("XID Errors", the driver's deployment documentation, r580),
//! its "resolution" column: an XID listed there as needing a GPU reset, a node reboot or a
//! drain, or as a hardware fault, is fatal here. XIDs that an application's own fault usually
//! causes (13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45
//! preemptive cleanup) are left out: they do not name the device. docs/health.md has the table.

/// The highest XID read (from a kernel log) or accepted (in `gpu-health.fatal-xids`).
pub const MAX_XID: u32 = 65_535;

/// One fatal XID and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatalXid {
    pub xid: u32,
    pub name: &'static str,
    /// The catalogue's resolution, as the action of a finding.
    pub action: &'static str,
}

/// The default fatal XIDs.
pub const FATAL_XIDS: &[FatalXid] = &[
    FatalXid { xid: 48, name: "double-bit ECC error", action: "reset the GPU; replace it if it recurs" },
    FatalXid {
        xid: 62,
        name: "internal micro-controller halt",
        action: "reset the GPU; reboot the node if the reset fails",
    },
    FatalXid {
        xid: 63,
        name: "ECC page retirement or row-remapping event",
        action: "reset the GPU to apply the remapping or retirement",
    },
    FatalXid {
        xid: 64,
        name: "ECC page retirement or row-remapping failure",
        action: "reset the GPU; replace it if it recurs",
    },
    FatalXid {
        xid: 74,
        name: "NVLink error",
        action: "reset the GPU; inspect the NVLink/NVSwitch fabric if it recurs",
    },
    FatalXid {
        xid: 79,
        name: "GPU has fallen off the bus",
        action: "reboot the node; reseat or replace the GPU if it recurs",
    },
    FatalXid { xid: 92, name: "high single-bit ECC error rate", action: "reset the GPU; replace it if it recurs" },
    FatalXid { xid: 94, name: "contained ECC error", action: "reset the GPU to clear the contained error" },
    FatalXid {
        xid: 95,
        name: "uncontained ECC error",
        action: "reset the GPU (reboot the node where the reset fails)",
    },
    FatalXid { xid: 119, name: "GSP RPC timeout", action: "reset the GPU; reboot the node if the reset fails" },
    FatalXid { xid: 120, name: "GSP error", action: "reset the GPU; reboot the node if the reset fails" },
    FatalXid { xid: 140, name: "unrecovered ECC error", action: "reset the GPU; replace it if it recurs" },
];

/// The default table as a list of numbers.
pub fn default_fatal() -> Vec<u32> {
    FATAL_XIDS.iter().map(|x| x.xid).collect()
}

/// The table's entry for `xid`.
fn entry(xid: u64) -> Option<&'static FatalXid> {
    FATAL_XIDS.iter().find(|x| u64::from(x.xid) == xid)
}

/// The catalogue's name of `xid`, where the table has it.
pub fn name(xid: u64) -> Option<&'static str> {
    entry(xid).map(|x| x.name)
}

/// The catalogue's action for `xid`, where the table has it.
pub fn action(xid: u64) -> Option<&'static str> {
    entry(xid).map(|x| x.action)
}
