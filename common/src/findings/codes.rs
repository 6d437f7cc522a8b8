//! The list of every finding code, in the order of docs/findings.md: one entry each (code,
//! worst severity, the severities as the docs state them, what raises it, where it is placed,
//! what it means, what to do).

use super::{CodeDoc, Raised};
use crate::registry::CheckId;
use crate::report::Severity;

finding_codes! {
    WorkerCrashed = "WORKER_CRASHED", Critical, "critical", [AnyCheck], "rank",
        "the worker process died (exit status or signal); `evidence` holds its last output lines",
        "exclude the node; read the last output";
    CheckError = "CHECK_ERROR", Critical, "critical (warning beside a crash)", [AnyCheck], "rank",
        "the check raised an error (device call, broken connection)",
        "exclude the node";
    TestHang = "TEST_HANG", Critical, "critical", [AnyCheck], "rank",
        "the test overran `--sanity-check-timeout-per-test`, or stalled for `diagnosis.stall-s` (no progress on a node, or a rank without heartbeats; the evidence says which); this rank never reached the point its peers wait at (heartbeats stopped, or the least progress in the earliest check that overran: peers may already wait in the next check); `evidence` lists where the waiting ranks were",
        "exclude the node; reset the GPU";
    NodeLost = "NODE_LOST", Critical, "critical", [Rendezvous], "node",
        "the node never reported its results (network down or node dead)",
        "exclude the node; check its link";
    NodeMissing = "NODE_MISSING", Critical, "critical", [Rendezvous], "node",
        "the node never arrived at the rendezvous within the smaller of `--rdzv-timeout` and what was left of `--sanity-check-max-time` (not started, unreachable or dead); node 0 writes the report, no check runs, and every node that arrived exits 1",
        "exclude the node or start its launcher; check that it reaches node 0's address and port";
    NodeGpuUnusable = "NODE_GPU_UNUSABLE", Critical, "critical", [Device], "node",
        "the node has NVIDIA hardware (`/proc/driver/nvidia`, `/dev/nvidia*`, or an NVIDIA display/3D controller on the PCI bus) but CUDA cannot use its GPUs: no driver, a `CUDA_VISIBLE_DEVICES` naming no GPU, a GPU CUDA cannot open, cuBLAS or NCCL missing; the message names the node, the GPUs' PCI bus ids and CUDA's error, the evidence the census and the device variables (`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES`). Decided before any check (`--device auto` or `cuda`); no check runs, exit 1",
        "exclude the node; check the driver (nvidia-smi), `CUDA_VISIBLE_DEVICES` and the device plugin";
    NodeNoGpu = "NODE_NO_GPU", Critical, "critical", [Device], "node",
        "a GPU check was asked for (`--device cuda`; the agent's default for a GPU job) on a node with no NVIDIA hardware at all",
        "schedule GPU jobs on GPU nodes; if it has GPUs, check that they are on the PCI bus";
    NodeGpusMissing = "NODE_GPUS_MISSING", Critical, "critical", [Device], "node",
        "CUDA can use fewer GPUs than the job asked for on the node (the largest of `--nproc-per-node`, `SLURM_GPUS_ON_NODE`, the count of `SLURM_JOB_GPUS`, `gpu-health.expected-gpus`); names the missing local GPUs and who asked; no check runs, exit 1",
        "exclude the node, or ask for the GPUs it has";
    RunTimeout = "RUN_TIMEOUT", Critical, "critical", [Run, Service], "job",
        "the whole run overran `--sanity-check-max-time` with every rank alive (check `run`: the launcher's own limit), or overran it plus `deadline_grace_s` without a verdict from node 0 (check `service`: see the `RUN_UNFINISHED` findings beside it)",
        "raise the max time or select fewer checks";
    RunInterrupted = "RUN_INTERRUPTED", Critical, "critical", [Run], "job",
        "a launcher was stopped by SIGTERM/SIGINT",
        "—";
    GemmWrongResult = "GEMM_WRONG_RESULT", Critical, "critical", [Check(CheckId::Gemm)], "rank",
        "a verified tile of C differs from the f64 reference",
        "exclude the node; reset the GPU";
    GemmResultMismatch = "GEMM_RESULT_MISMATCH", Critical, "critical (warning without a majority)", [Check(CheckId::Gemm)], "rank",
        "the hash of C differs from the majority of ranks of the same model",
        "exclude the node";
    GemmSlow = "GEMM_SLOW", Critical, "critical / warning", [Check(CheckId::Gemm)], "rank",
        "TFLOP/s below the peers' band (same device model) in two measurements",
        "exclude the node; check clocks, power, other processes";
    GemmBelowExpected = "GEMM_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::Gemm)], "rank",
        "TFLOP/s below the expected band of its device model",
        "as above";
    AllreduceWrongResult = "ALLREDUCE_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllReduce)], "rank",
        "reduced elements differ from the exact sum",
        "exclude the node";
    AllreduceSlow = "ALLREDUCE_SLOW", Critical, "critical / warning", [Check(CheckId::AllReduce)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AllreduceBelowExpected = "ALLREDUCE_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllReduce)], "job",
        "busbw of the (single-node) job below the expected band of its device model",
        "inspect NVLink/NIC state, NCCL settings";
    BelowFleet = "BELOW_FLEET", Critical, "critical", [HeadlineChecks], "rank (job for a collective)",
        "the headline figure is below its fleet baseline (`--baseline FILE`, learned by the service from passed runs of the same device model, driver major, check and conditions): under centre - max(k x spread, min_gap x centre); the finding's check names the check, its evidence the baseline (centre, spread, samples, nodes, window) and the rank's fleet percentile",
        "exclude the node; check clocks, power, temperature and other processes; if the whole fleet changed (a driver update), export a new baseline";
    NodeCommSlow = "NODE_COMM_SLOW", Critical, "critical", [Check(CheckId::PairBandwidth)], "node",
        "every measured pair with this node is below 30% of the best pair",
        "exclude the node; inspect its NIC, cable, switch port";
    LinkSlow = "LINK_SLOW", Critical, "critical (warning when unresolved)", [Check(CheckId::PairBandwidth)], "pair",
        "one node pair is slow while both nodes are fast with others (critical), or the figures cannot tell which end is slow (warning)",
        "inspect the path between the two nodes";
    WrongResult = "WRONG_RESULT", Critical, "critical", [OtherChecks], "rank",
        "a check's own verifier failed (checks without a code of their own)",
        "exclude the node";
    LinkWrongResult = "LINK_WRONG_RESULT", Critical, "critical", [Check(CheckId::PairBandwidth)], "rank",
        "the link test's reduced values are wrong",
        "exclude the node";
    AllgatherWrongResult = "ALLGATHER_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllGather)], "rank",
        "a gathered block differs from what its sender holds (value, sender or offset)",
        "exclude the node";
    AllgatherSlow = "ALLGATHER_SLOW", Critical, "critical / warning", [Check(CheckId::AllGather)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AllgatherBelowExpected = "ALLGATHER_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllGather)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
    ReducescatterWrongResult = "REDUCESCATTER_WRONG_RESULT", Critical, "critical", [Check(CheckId::ReduceScatter)], "rank",
        "this rank's block of the sum differs from the exact one",
        "exclude the node";
    ReducescatterSlow = "REDUCESCATTER_SLOW", Critical, "critical / warning", [Check(CheckId::ReduceScatter)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    ReducescatterBelowExpected = "REDUCESCATTER_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::ReduceScatter)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
    AlltoallWrongResult = "ALLTOALL_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllToAll)], "rank",
        "a received block differs from what its sender sent to this rank",
        "exclude the node";
    AlltoallSlow = "ALLTOALL_SLOW", Critical, "critical / warning", [Check(CheckId::AllToAll)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AlltoallBelowExpected = "ALLTOALL_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllToAll)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
    MultiAllreduceWrongResult = "MULTI_ALLREDUCE_WRONG_RESULT", Critical, "critical", [Check(CheckId::MultiAllReduce)], "rank",
        "a group's sums differ from the exact ones",
        "exclude the node";
    MultiAllreduceSlowGroup = "MULTI_ALLREDUCE_SLOW_GROUP", Critical, "critical", [Check(CheckId::MultiAllReduce)], "group (its ranks)",
        "one rail, node or world group far below the other groups of its kind running at the same time (GPU only)",
        "inspect that rail's NIC, cable and switch port, or the node";
    NetFrontendUnreachable = "NET_FRONTEND_UNREACHABLE", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "node",
        "no other node reaches this node's host network (TCP)",
        "check the node's front-end link, firewall, address";
    NetFrontendPairFailed = "NET_FRONTEND_PAIR_FAILED", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "pair",
        "one node pair fails on the host network while both ends reach others",
        "inspect the path between the two nodes";
    NetBackendRankUnreachable = "NET_BACKEND_RANK_UNREACHABLE", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "rank",
        "every back-end probe (NCCL send/recv, or the CPU transport) with this rank failed or timed out",
        "exclude the node; inspect its GPU network";
    NetBackendPairFailed = "NET_BACKEND_PAIR_FAILED", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "pair",
        "one rank pair fails on the back end while both ends reach others (or the pair cannot be split, two ranks)",
        "inspect the path between the two";
    NetIbPortNotActive = "NET_IB_PORT_NOT_ACTIVE", Warning, "warning", [Check(CheckId::NetworkConnectivity)], "node",
        "an RDMA port under /sys/class/infiniband is not ACTIVE",
        "check the port, cable and subnet manager";
    OverlapWrongResult = "OVERLAP_WRONG_RESULT", Critical, "critical", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "the GEMM or the all-reduce run together gave a wrong result",
        "exclude the node";
    OverlapSlow = "OVERLAP_SLOW", Critical, "critical / warning", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "overlapped steps per second below the peers' band",
        "exclude the node";
    OverlapBelowExpected = "OVERLAP_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "below the expected band (where the data file has one)",
        "as above";
    KernelLaunchFailed = "KERNEL_LAUNCH_FAILED", Critical, "critical", [Check(CheckId::KernelLaunch)], "rank",
        "a launch or its synchronisation failed",
        "reset the GPU; exclude the node";
    KernelLaunchSlow = "KERNEL_LAUNCH_SLOW", Critical, "critical / warning", [Check(CheckId::KernelLaunch)], "rank",
        "launch round trips per second below the peers' band",
        "check the host (CPU frequency, load) and the driver";
    KernelLaunchBelowExpected = "KERNEL_LAUNCH_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::KernelLaunch)], "rank",
        "below the expected band (where the data file has one)",
        "as above";
    GpuHealthMissingGpu = "GPU_HEALTH_MISSING_GPU", Critical, "critical", [Check(CheckId::GpuHealth)], "node",
        "NVML sees fewer GPUs on the node than expected (`gpu-health.expected-gpus`, else the workers started there): \"7 of 8 GPUs visible\"",
        "exclude the node; a GPU that fell off the bus or was not enumerated needs a reboot";
    GpuHealthNvmlUnavailable = "GPU_HEALTH_NVML_UNAVAILABLE", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "on a CUDA worker NVML (libnvidia-ml.so.1) could not be loaded or read: the GPU's health is unknown; the node is suspect",
        "make the driver's libnvidia-ml.so.1 visible to the check";
    GpuHealthEccDisabled = "GPU_HEALTH_ECC_DISABLED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "ECC is off: memory errors go undetected",
        "enable ECC and reset the GPU";
    GpuHealthEccUncorrectable = "GPU_HEALTH_ECC_UNCORRECTABLE", Critical, "critical (warning when only aggregate)", [Check(CheckId::GpuHealth)], "rank",
        "uncorrectable ECC errors since the driver loaded (volatile); aggregate-only counts (over the device's life) warn",
        "exclude the node; reset the GPU; replace it if they recur";
    GpuHealthRowRemapPending = "GPU_HEALTH_ROW_REMAP_PENDING", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a row remap waits for a GPU reset",
        "exclude the node; reset the GPU";
    GpuHealthRowRemapFailed = "GPU_HEALTH_ROW_REMAP_FAILED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a row remapping failed: an error the memory cannot repair",
        "exclude the node; replace the GPU";
    GpuHealthBanksExhausted = "GPU_HEALTH_BANKS_EXHAUSTED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "memory banks with no spare rows left (remapped-rows histogram, \"none\")",
        "plan to replace the GPU";
    GpuHealthPageRetirementPending = "GPU_HEALTH_PAGE_RETIREMENT_PENDING", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a page retirement waits for a reset (GPUs before row remapping)",
        "exclude the node; reset the GPU";
    GpuHealthPagesRetired = "GPU_HEALTH_PAGES_RETIRED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "60 or more retired pages",
        "exclude the node; replace the GPU";
    GpuHealthXidFatal = "GPU_HEALTH_XID_FATAL", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "an XID of the fatal table (`gpu-health.fatal-xids`, docs/health.md) during the window; evidence: the count of events",
        "exclude the node; reset the GPU or reboot as the XID catalogue says";
    GpuHealthXid = "GPU_HEALTH_XID", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "another XID during the window",
        "read the kernel log for the XID's detail";
    GpuHealthHwSlowdown = "GPU_HEALTH_HW_SLOWDOWN", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "HW slowdown, HW thermal slowdown or HW power brake active at the end of the load, or their time counters rose during the window",
        "exclude the node; check cooling, power supply and the power-brake signal";
    GpuHealthSwThermal = "GPU_HEALTH_SW_THERMAL", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the driver lowered the clocks for temperature",
        "check the node's cooling";
    GpuHealthSmClockLow = "GPU_HEALTH_SM_CLOCK_LOW", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the highest SM clock under the check's load below `gpu-health.min-clock-fraction` (0.5) of its maximum",
        "check clock locks, power limits, clock-event reasons";
    GpuHealthHot = "GPU_HEALTH_HOT", Critical, "critical / warning", [Check(CheckId::GpuHealth)], "rank",
        "GPU temperature at or above its slowdown threshold (critical), or within 5 C of it (warning)",
        "check cooling; exclude the node if it stays hot";
    GpuHealthPowerCapped = "GPU_HEALTH_POWER_CAPPED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the enforced power limit is below the default limit",
        "restore the power limit unless lowered on purpose";
    GpuHealthPcieDegraded = "GPU_HEALTH_PCIE_DEGRADED", Critical, "critical (width) / warning (generation)", [Check(CheckId::GpuHealth)], "rank",
        "the PCIe link under load is narrower than its maximum (x8 of x16: critical) or of a lower generation (warning)",
        "reseat the GPU or riser; check slot and BIOS settings";
    GpuHealthPcieReplays = "GPU_HEALTH_PCIE_REPLAYS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the PCIe replay counter rose during the window",
        "inspect the PCIe link";
    GpuHealthNvlinkDown = "GPU_HEALTH_NVLINK_DOWN", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "some NVLinks of the GPU are up and others down (none up: no NVLink fabric here, not judged)",
        "inspect the NVLink/NVSwitch fabric";
    GpuHealthNvlinkErrors = "GPU_HEALTH_NVLINK_ERRORS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "NVLink CRC flit/data, replay or recovery counters rose during the window",
        "inspect the fabric; exclude the node if they keep rising";
    GpuHealthRecoveryAction = "GPU_HEALTH_RECOVERY_ACTION", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "the driver recommends a recovery action (GPU reset, node reboot, drain)",
        "exclude the node; carry out the action";
    GpuHealthLeftoverMemory = "GPU_HEALTH_LEFTOVER_MEMORY", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "processes other than the run's own workers hold more GPU memory than `gpu-health.leftover-memory-mib` (1024) on the rank's GPU; names each (pid, name from /proc where readable, kind, MiB)",
        "end the processes (a previous job's that did not exit) or exclude the node";
    GpuHealthForeignCompute = "GPU_HEALTH_FOREIGN_COMPUTE", Critical, "critical (warning with `gpu-health.foreign-compute=warning`)", [Check(CheckId::GpuHealth)], "rank",
        "another process computed on the rank's GPU during the run (NVML's per-process SM utilisation above 0); names it",
        "end the process or exclude the node: the job would share the GPU";
    GpuHealthOtherProcess = "GPU_HEALTH_OTHER_PROCESS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "other processes are on the GPU, below the memory share and not computing; named",
        "check what they are";
    GpuHealthComputeMode = "GPU_HEALTH_COMPUTE_MODE", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "compute mode Prohibited, or Exclusive_Process with another process already on the GPU: the job cannot open it",
        "set the default compute mode (`nvidia-smi -c DEFAULT`) or end the other process";
    GpuHealthMigEnabled = "GPU_HEALTH_MIG_ENABLED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "MIG mode is on and the job did not ask for MIG (`gpu-health.allow-mig=true` says it did)",
        "disable MIG and reset the GPU";
    GpuHealthMigPending = "GPU_HEALTH_MIG_PENDING", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "a MIG mode change waits for a GPU reset",
        "reset the GPU";
    GpuHealthEccPending = "GPU_HEALTH_ECC_PENDING", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "an ECC mode change waits for a GPU reset",
        "reset the GPU";
    GpuHealthAppClocksLow = "GPU_HEALTH_APP_CLOCKS_LOW", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the application SM clock is set below its default",
        "reset the application clocks (`nvidia-smi -rac`)";
    GpuHealthClocksLocked = "GPU_HEALTH_CLOCKS_LOCKED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the SM clocks are locked below the GPU's maximum (`nvidia-smi -lgc`); allowed by `gpu-health.allow-locked-clocks=true`",
        "reset them (`nvidia-smi -rgc`)";
    GpuHealthMpsActive = "GPU_HEALTH_MPS_ACTIVE", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "an MPS control daemon serves the node (its pipe directory's control socket, or its processes); allowed by `gpu-health.allow-mps=true`",
        "stop it (`quit` on `nvidia-cuda-mps-control`'s stdin) or exclude the node";
    GpuHealthPersistenceOff = "GPU_HEALTH_PERSISTENCE_OFF", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "persistence mode is off",
        "enable nvidia-persistenced";
    GpuHealthDriverOld = "GPU_HEALTH_DRIVER_OLD", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "the driver is below `gpu-health.min-driver` (unset by default: no minimum)",
        "upgrade the driver";
    MemoryBwWrongResult = "MEMORY_BW_WRONG_RESULT", Critical, "critical", [Check(CheckId::MemoryBandwidth)], "rank",
        "16-byte words of the copy's source or destination differ from the fill pattern after the timed copies (`evidence`: how many, the first byte)",
        "exclude the node; reset the GPU (its memory or copy path corrupts data)";
    MemoryBwSlow = "MEMORY_BW_SLOW", Critical, "critical / warning", [Check(CheckId::MemoryBandwidth)], "rank",
        "device-to-device copy GB/s (read + written, median) below the peers' band in two measurements",
        "exclude the node; check clocks, memory errors, other processes";
    MemoryBwBelowExpected = "MEMORY_BW_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::MemoryBandwidth)], "rank",
        "below the expected band of its device model (H200: 4200 GB/s at the default 4 GiB, the driver's copy)",
        "as above";
    HostBwWrongResult = "HOST_BW_WRONG_RESULT", Critical, "critical", [Check(CheckId::HostBandwidth)], "rank",
        "words copied across the host link (either direction, alone or with the node's other GPUs) differ from what the other side held",
        "exclude the node; reseat or inspect the GPU's PCIe path";
    HostBwSlow = "HOST_BW_SLOW", Critical, "critical / warning", [Check(CheckId::HostBandwidth)], "rank",
        "the lower of pinned host-to-device and device-to-host GB/s (each GPU alone) below the peers' band in two measurements",
        "check the GPU's PCIe link (width, generation: `nvidia-smi -q`), its NUMA placement";
    HostBwBelowExpected = "HOST_BW_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::HostBandwidth)], "rank",
        "below the expected band of its model (H100, H200 on PCIe gen5 x16: 55 GB/s)",
        "as above";
    HostBwConcurrentSlow = "HOST_BW_CONCURRENT_SLOW", Warning, "warning", [Check(CheckId::HostBandwidth)], "rank",
        "with every GPU of the node copying at once, this GPU's host link (the lower direction) is below `diagnosis.slow-fraction` of its peers' median: a PCIe switch shared with another GPU or NIC, or the wrong NUMA node",
        "check the PCIe topology (`nvidia-smi topo -m`) and the CPU affinity of the processes";
    RdmaPortDown = "RDMA_PORT_DOWN", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "an RDMA port is not ACTIVE / LinkUp (or disappeared during the span); the message names device, port and both states",
        "check the cable, transceiver, switch port and subnet manager; exclude the node";
    RdmaPortRateLow = "RDMA_PORT_RATE_LOW", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "an active port's rate is below `rdma-ports.expected-rate-gbps`, or else below the fastest port of the same link layer on the node",
        "reseat or replace the cable or transceiver; check the switch port's speed";
    RdmaPortFlapped = "RDMA_PORT_FLAPPED", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "`link_downed` or `link_error_recovery` grew during the span (since the worker started; `evidence` has the deltas): the link went down or retrained",
        "replace the cable or transceiver; exclude the node";
    RdmaPortErrors = "RDMA_PORT_ERRORS", Warning, "warning", [Check(CheckId::RdmaPorts)], "node",
        "`symbol_error`, `port_rcv_errors` or `excessive_buffer_overrun_errors` grew during the span on a link that stayed up",
        "watch the port (a marginal cable or transceiver)";
    ModelLossNotFinite = "MODEL_LOSS_NOT_FINITE", Critical, "critical (warning for ranks that only received it)", [ModelChecks], "rank",
        "the loss became NaN or infinite at the named step",
        "exclude the node; reset the GPU";
    ModelLossNotFalling = "MODEL_LOSS_NOT_FALLING", Critical, "critical", [ModelChecks], "rank",
        "the loss on the learnable task stayed flat or rose",
        "check the devices' numerics; re-run";
    ModelSilentDataCorruption = "MODEL_SILENT_DATA_CORRUPTION", Critical, "critical", [ModelChecks], "rank",
        "after training, this data-parallel rank's parameter checksum differs from the majority (or changed after its last update)",
        "exclude the node";
    ModelSlowStep = "MODEL_SLOW_STEP", Critical, "critical", [ModelChecks], "rank",
        "compute step rate below the peers' band",
        "exclude the node";
    NoAgent = "NO_AGENT", Critical, "critical", [Service], "node",
        "the job's node has no live `gpusanity agent`",
        "start the agent on the node";
    AgentLost = "AGENT_LOST", Critical, "critical", [Service], "node",
        "the node's agent went silent during the run",
        "check the node; restart its agent";
    SettingsUnreadable = "SETTINGS_UNREADABLE", Critical, "critical", [Service], "run",
        "the run's stored settings do not parse (a corrupt row), so its timeout policy is unknown: the run ends failed (`reason: error`) rather than guessing MarkJobFail or KeepJobHang",
        "repair or remove the row; publish the job again";
    ServiceBlind = "SERVICE_BLIND", Warning, "warning", [Service], "run",
        "the verdict was reached across an outage of the service's own broker connection (it could not hear its agents for the times listed); silence in that time was not held against any node",
        "none: a node named only for a silence that overlapped it is not isolated";
    AgentNoStart = "AGENT_NO_START", Critical, "critical", [Service], "node",
        "node 0's agent did not start the run in time",
        "check node 0 and its agent";
    DataPlaneError = "DATA_PLANE_ERROR", Critical, "critical", [Service], "node",
        "node 0's launcher ended without a report",
        "read the agent's log on node 0";
    RunUnfinished = "RUN_UNFINISHED", Critical, "critical", [Service], "node",
        "at the service's overrun, this node's launcher had not ended (its ranks did not finish); the node is isolated",
        "read the launcher log on the node; exclude the node";
}
