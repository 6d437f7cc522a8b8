#!/usr/bin/env bash
# gpu-health on the GPU machine: its wall time alone and within the default set (against the
# old default gemm,all-reduce, so the difference is its cost), its readings (the raw NVML
# readings of every GPU, to be kept as a fixture under common/data/health/), and a run with a
# census it must fail (one more GPU expected than the node has).
# Usage (repository root, release binary carried):
#   BIN=.carry/gpusanity OUT=$OUT/health bash bench/gpu/health.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-health}
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.max.sm,temperature.gpu,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
ls -l /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/lib64/libnvidia-ml.so.1 2>/dev/null

to() { # file, then the command: its output goes to the file (so `wall` still prints here)
  local f=$1; shift
  "$@" > "$f" 2>&1
}

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["summary"])
for c in r["checks"]:
    print("  %-12s %-14s %5.3f s" % (c["name"], c["status"], c["duration_s"]))
    if c["name"] == "gpu-health":
        for k in c["ranks"]:
            n = k.get("notes", {})
            print("    r%d %s | %s | %s | %s" % (k["rank"], k["status"], n.get("window", ""), n.get("load", ""),
                  n.get("not_applicable") or (k.get("detail") or {}).get("why") or n.get("nvml_unavailable") or ""))
            print("    metrics:", json.dumps(k["metrics"]))
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "rank", f.get("rank"), "node", f.get("node_rank"), "|", f["message"][:200])
PY
}

readings() { # report.json, file: the readings of every rank, one JSON per line
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as out:
    for c in r["checks"]:
        if c["name"] == "gpu-health":
            for k in c["ranks"]:
                d = k.get("detail") or {}
                if "readings" in d:
                    out.write(json.dumps(d["readings"]) + "\n")
print(open(sys.argv[2]).read())
PY
}

echo "== gpu-health alone, three times"
for i in 1 2 3; do
  wall "gpu-health-$i" to "$OUT/h$i.txt" "$BIN" check --micro-benchmarks gpu-health --report-dir "$OUT/h$i"
  summary "$OUT/h$i/report.json"
done
echo "== the raw readings (a fixture for common/data/health/)"
readings "$OUT/h1/report.json" "$OUT/readings.jsonl"
echo "== the old default (gemm,all-reduce) and the new default (gemm,all-reduce,gpu-health), alternated"
for i in 1 2 3; do
  wall "old-default-$i" to "$OUT/o$i.txt" "$BIN" check --micro-benchmarks gemm,all-reduce --report-dir "$OUT/o$i"
  summary "$OUT/o$i/report.json" | head -1
  wall "new-default-$i" to "$OUT/n$i.txt" "$BIN" check --report-dir "$OUT/n$i"
  summary "$OUT/n$i/report.json"
done
echo "== the census must fail: one GPU more expected than visible"
NGPU=$(nvidia-smi -L | wc -l)
wall census to "$OUT/c.txt" "$BIN" check --micro-benchmarks gpu-health \
  --check-param "gpu-health.expected-gpus=$((NGPU + 1))" --report-dir "$OUT/c"
summary "$OUT/c/report.json" | grep -E "^status|finding"
