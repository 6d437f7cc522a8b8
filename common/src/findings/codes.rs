//! The list of every finding code, in the order of docs/findings.md: one entry each (code,
//! worst severity, the severities as the docs state them, what raises it, where it is placed,
//! what it means, what to do). The codes that are not one check's are listed here; each check's
//! own follow, in run order, from the `check_codes!` list of its descriptor module, gathered in
//! [`crate::checks`].

/// The codes that are not one check's, handed on to `$then` after those already gathered, with
/// the descriptor modules whose codes follow (as each check's `codes!` does).
macro_rules! general_codes {
    ($then:ident [$($gathered:tt)*] $($rest:ident)*) => {
        $then! {
            [
            $($gathered)*
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
                "the node never reported its results (network down or node dead), or what it posted is not an outcome node 0 can read (the message says `malformed outcome:` and why)",
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
            NodeKernelXidFatal = "NODE_KERNEL_XID_FATAL", Critical, "critical (warning with `gpu-health.kernel-xids=warning`)", [Device], "node",
                "the kernel log (`/dev/kmsg`, else the journal of this boot) holds an XID of the fatal table (`gpu-health.fatal-xids`) on one of the job's GPUs that no later GPU reset, driver reload or reboot cleared: the previous job left the GPU broken; names the GPU's PCI address, the XID, when, and the log's lines",
                "the XID catalogue's action (in the finding): reset the GPU or reboot the node, then acknowledge the reset in the log (docs/health.md)";
            NodeKernelXid = "NODE_KERNEL_XID", Warning, "warning", [Device], "node",
                "another XID on one of the job's GPUs in the kernel log since the last reset or boot (often the previous job's own fault)",
                "read the XID's line; reset the GPU if it recurs";
            NodeKernelLogUnreadable = "NODE_KERNEL_LOG_UNREADABLE", Warning, "warning", [Device], "node",
                "the kernel log could not be read (no CAP_SYSLOG, `kernel.dmesg_restrict`, a pod without the host's `/dev/kmsg` or journal): XIDs raised before the check are not seen",
                "grant the check the log (docs/health.md, docs/kubernetes.md)";
            NodeShmSmall = "NODE_SHM_SMALL", Critical, "critical (policy: `gpu-health.shm`)", [Device], "node",
                "`/dev/shm` is smaller than the node's ranks need for NCCL's shared-memory transport (`gpu-health.shm-mib-per-rank`, 32 MiB, times the ranks; judged from two ranks)",
                "give the pod a larger `/dev/shm` (an emptyDir of medium Memory)";
            NodeMemlockLimited = "NODE_MEMLOCK_LIMITED", Critical, "critical (policy: `gpu-health.memlock`)", [Device], "node",
                "`RLIMIT_MEMLOCK` is not unlimited on a node with RDMA devices: NCCL's memory registration fails",
                "set the memlock limit to unlimited for the container runtime";
            NodeNoGpudirectRdma = "NODE_NO_GPUDIRECT_RDMA", Critical, "critical or warning by `gpu-health.gpudirect-rdma` (default: warning)", [Device], "node",
                "RDMA devices but no GPUDirect RDMA path: `nvidia_peermem` not loaded and no DMA-BUF (open kernel module on Linux 5.12+): traffic is staged through host memory",
                "load `nvidia-peermem`, or use the open kernel module";
            NodePcieAcsEnabled = "NODE_PCIE_ACS_ENABLED", Critical, "critical or warning by `gpu-health.pcie-acs` (default: warning)", [Device], "node",
                "PCIe ACS P2P Request or Completion Redirect is enabled on a bridge above the job's GPUs (with two GPUs or a GPU and a NIC): peer-to-peer traffic detours through the root complex; names each bridge and its ACS control",
                "disable ACS on bare metal (BIOS or setpci)";
            NodePcieAcsUnreadable = "NODE_PCIE_ACS_UNREADABLE", Warning, "warning", [Device], "node",
                "the extended PCIe configuration space of the bridges above the GPUs could not be read (it needs root): ACS was not judged",
                "run the check as root where ACS matters";
            NodeDriverTooOld = "NODE_DRIVER_TOO_OLD", Critical, "critical (policy: `gpu-health.bundled-driver`)", [Device], "node",
                "the NVIDIA driver (`/proc/driver/nvidia/version`) is older than the CUDA libraries gpusanity runs require (CUDA 13: 580 or later); named before CUDA fails to open",
                "upgrade the driver";
            RunTimeout = "RUN_TIMEOUT", Critical, "critical", [Run, Service], "job",
                "the whole run overran `--sanity-check-max-time` with every rank alive (check `run`: the launcher's own limit), or overran it plus `deadline_grace_s` without a verdict from node 0 (check `service`: see the `RUN_UNFINISHED` findings beside it)",
                "raise the max time or select fewer checks";
            RunInterrupted = "RUN_INTERRUPTED", Critical, "critical", [Run], "job",
                "a launcher was stopped by SIGTERM/SIGINT",
                "—";
            BelowFleet = "BELOW_FLEET", Critical, "critical", [HeadlineChecks], "rank (job for a collective)",
                "the headline figure is below its fleet baseline (`--baseline FILE`, learned by the service from passed runs of the same device model, driver major, check and conditions): under centre - max(k x spread, min_gap x centre); the finding's check names the check, its evidence the baseline (centre, spread, samples, nodes, window) and the rank's fleet percentile",
                "exclude the node; check clocks, power, temperature and other processes; if the whole fleet changed (a driver update), export a new baseline";
            WrongResult = "WRONG_RESULT", Critical, "critical", [OtherChecks], "rank",
                "a check's own verifier failed (checks without a code of their own)",
                "exclude the node";
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
            ]
            $($rest)*
        }
    };
}
pub(crate) use general_codes;
