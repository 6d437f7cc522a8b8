#!/usr/bin/env bash
# What the host reading costs a CPU run (docs/health.md, "Ready for the next job"): a rig's node
# tree with one GPU, a bridge, an RDMA device, and a kernel log of LINES lines (about 60 bytes
# each, a few XIDs among them), read RUNS times by `gpusanity check --device cpu --test-faults`;
# prints each run's `hosts[].readings.read_ms`. The target: under 50 ms.
#
#   BIN=target/x86_64-unknown-linux-gnu/release/gpusanity LINES=20000 RUNS=5 bash bench/host_read.sh
set -eu
BIN=${BIN:-target/x86_64-unknown-linux-gnu/release/gpusanity}
LINES=${LINES:-20000}
RUNS=${RUNS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" "$LINES" <<'PY'
import os, sys
root, lines = os.path.join(sys.argv[1], "tree"), int(sys.argv[2])
def w(p, v):
    p = os.path.join(root, p); os.makedirs(os.path.dirname(p), exist_ok=True); open(p, "wb").write(v)
w("proc/driver/nvidia/version", b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n")
dev = "sys/devices/pci0000:00/0000:18:00.0/0000:19:00.0"
w(dev + "/vendor", b"0x10de\n"); w(dev + "/class", b"0x030200\n")
cfg = bytearray(4096); cfg[0x100:0x104] = (0x000d | (1 << 16)).to_bytes(4, "little")
w("sys/devices/pci0000:00/0000:18:00.0/config", bytes(cfg))
os.makedirs(root + "/sys/bus/pci/devices", exist_ok=True)
os.symlink(os.path.join(root, dev), root + "/sys/bus/pci/devices/0000:19:00.0")
w("rig/shm-bytes", b"8589934592\n")
w("proc/self/limits", b"Max locked memory         unlimited            unlimited            bytes\n")
w("proc/modules", b"nvidia_peermem 1 0 - Live 0x0\n")
w("proc/sys/kernel/osrelease", b"6.8.0\n")
w("sys/class/infiniband/mlx5_0/node_type", b"1: CA\n")
log = ["6,%d,%d,-;some kernel line number %d eth0: link up" % (i, i * 1000, i) for i in range(lines)]
for k in range(0, lines, max(1, lines // 4)):
    log[k] = "4,%d,%d,-;NVRM: Xid (PCI:0000:19:00): 13, pid=1, Graphics SM Warp Exception" % (k, k * 1000)
open(os.path.join(sys.argv[1], "kmsg"), "w").write("\n".join(log) + "\n")
PY
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); $(nproc) cores; log $(stat -c %s "$work/kmsg") bytes, $LINES lines"
for i in $(seq 1 "$RUNS"); do
  GPUSANITY_TEST_HW_ROOT="$work/tree" GPUSANITY_TEST_KMSG="$work/kmsg" "$BIN" check --device cpu --test-faults \
    --micro-benchmarks=all-reduce --nproc-per-node 2 --report-dir "$work/r$i" > /dev/null 2>&1 || true
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
h = r['hosts'][0]['readings']
print('run %s: read_ms %.1f, %d lines, findings %s' % (sys.argv[2], h['read_ms'], h['kernel_log']['scan']['lines'], [f['code'] for f in r['findings']]))
" "$work/r$i/report.json" "$i"
done
