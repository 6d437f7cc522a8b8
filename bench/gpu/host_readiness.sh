#!/usr/bin/env bash
# The host's readiness on a GPU machine (docs/health.md, "Ready for the next job"): what the
# kernel log and this node's settings read and how they are judged, then the prolog's cost:
# `gpusanity check --quick` of the build before the host reading (OLD) and with it (NEW),
# alternated RUNS times each, wall times and their medians side by side.
#
#   OLD=/tmp/old/gpusanity NEW=/tmp/new/gpusanity RUNS=10 bash bench/gpu/host_readiness.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OLD=${OLD:?the build before the host reading}
NEW=${NEW:?the build with it}
RUNS=${RUNS:-10}
OUT=${OUT:-/tmp/gpusanity-host}
mkdir -p "$OUT"
# shellcheck source=bench/gpu/env.sh
. "$HERE/env.sh"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi -L
nvidia-smi --query-gpu=driver_version,pci.bus_id --format=csv,noheader
echo "uid $(id -u); kernel $(uname -r); kernel.dmesg_restrict=$(cat /proc/sys/kernel/dmesg_restrict 2>/dev/null)"
echo "/dev/kmsg: $(ls -l /dev/kmsg 2>&1)"
echo "XID lines in the kernel log now: $(dmesg 2>/dev/null | grep -c 'NVRM: Xid')"
echo "/dev/shm: $(df -h /dev/shm | tail -n 1)"
echo "memlock: $(ulimit -l)"
echo "RDMA devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
echo "nvidia_peermem: $(grep -c '^nvidia_peermem ' /proc/modules)"
head -n 1 /proc/driver/nvidia/version

echo "== the new build's host reading, as judged"
"$NEW" check --quick --report-dir "$OUT/new-once" > "$OUT/new-once.txt" 2>&1
echo "exit $?"
python3 - "$OUT/new-once/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status", r["status"], "|", r["summary"])
for h in r.get("hosts", []):
    rd = dict(h["readings"])
    log = rd.pop("kernel_log")
    if log.get("state") == "read":
        s = log["scan"]
        print("kernel log: read from %s, %d bytes, %d lines, %d XID lines, %d cleared, %d outstanding, boots %d, truncated %s"
              % (log["source"], log["bytes"], s["lines"], s["xid_lines"], s["cleared"], len(s["outstanding"]), s["boots"], log["truncated"]))
    else:
        print("kernel log:", log)
    print("readings:", json.dumps(rd, indent=1))
for f in r["findings"]:
    print("finding:", f["severity"], f["code"], "|", f["message"])
for c in r["checks"]:
    print("  %-20s %-15s %.2f s" % (c["name"], c["status"], c["duration_s"]))
PY

echo "== a fatal XID on this GPU in a rig's log (--test-faults, GPUSANITY_TEST_KMSG), then the same with a reset acknowledged"
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -n 1 | sed 's/^0000//' | tr 'A-F' 'a-f')
key=${bus%.*}
printf '6,1,0,-;Linux version %s\n3,2,94571234,-;NVRM: Xid (PCI:%s): 79, pid=4242, name=python, GPU has fallen off the bus.\n' "$(uname -r)" "$key" > "$OUT/kmsg-fatal"
cp "$OUT/kmsg-fatal" "$OUT/kmsg-reset"
printf '6,3,95000000,-;gpusanity: GPU %s reset\n' "$bus" >> "$OUT/kmsg-reset"
for case in fatal reset; do
  GPUSANITY_TEST_KMSG="$OUT/kmsg-$case" "$NEW" check --quick --test-faults --report-dir "$OUT/$case" > "$OUT/$case.txt" 2>&1
  echo "$case: exit $?"
  python3 - "$OUT/$case/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("  status", r["status"], "|", r["summary"][:300])
for f in r["findings"]:
    if f["check"] == "device":
        print("  finding:", f["severity"], f["code"], "|", f["message"], "| action:", f.get("action"))
PY
done
if command -v setpriv > /dev/null; then
  echo "== as an unprivileged user (uid 65534, no CAP_SYSLOG, kernel.dmesg_restrict=$(cat /proc/sys/kernel/dmesg_restrict))"
  mkdir -p "$OUT/nobody" && chmod 777 "$OUT/nobody"
  setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp "$NEW" check --quick --report-dir "$OUT/nobody/r" > "$OUT/nobody.txt" 2>&1
  echo "unprivileged: exit $?"
  python3 - "$OUT/nobody/r/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no report:", e); sys.exit()
print("  status", r["status"], "|", r["summary"][:300])
for f in r["findings"]:
    if f["check"] == "device":
        print("  finding:", f["severity"], f["code"], "|", f["message"])
PY
fi

echo "== --quick, alternated: OLD then NEW, $RUNS times each"
old_ms=(); new_ms=()
for i in $(seq 1 "$RUNS"); do
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    s=$(date +%s%N)
    "$bin" check --quick --report-dir "$OUT/$which-$i" > "$OUT/$which-$i.txt" 2>&1
    rc=$?
    e=$(date +%s%N)
    ms=$(( (e - s) / 1000000 ))
    echo "$which run $i: wall $ms ms, exit $rc"
    if [ "$which" = old ]; then old_ms+=("$ms"); else new_ms+=("$ms"); fi
  done
done
python3 - "${old_ms[*]}" "${new_ms[*]}" <<'PY'
import statistics, sys
old = [int(x) for x in sys.argv[1].split()]
new = [int(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(old), statistics.median(new)
print("median wall: old %.0f ms, new %.0f ms, difference %+.0f ms" % (mo, mn, mn - mo))
PY
python3 - "$OUT" "$RUNS" <<'PY'
import json, sys
ms = []
for i in range(1, int(sys.argv[2]) + 1):
    try:
        r = json.load(open("%s/new-%d/report.json" % (sys.argv[1], i)))
        ms += [h["readings"]["read_ms"] for h in r.get("hosts", [])]
    except Exception:
        pass
if ms:
    print("host read in the new runs: median %.1f ms, max %.1f ms" % (sorted(ms)[len(ms) // 2], max(ms)))
PY
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
