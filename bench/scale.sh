#!/usr/bin/env bash
# How the check's cost grows with the node count: N loopback nodes of $NPROC CPU workers each (default 1; every
# node its own launcher process, as on a real cluster), for N in $NODES (default 2 4 8 16 32 64),
# the checks in $CHECKS (default gemm,all-reduce,network-connectivity at small sizes). Prints per
# N: wall time of the slowest node, the exit codes, the probe and pair counts from node 0's
# report, and the findings. Growth no worse than n log n is the goal (docs/benchmarks.md).
set -eu
cd "$(dirname "$0")/.."
NODES=${NODES:-"2 4 8 16 32 64"}
CHECKS=${CHECKS:-gemm,all-reduce,network-connectivity}
PARAMS=${PARAMS-"--check-param gemm.size=256 --check-param all-reduce.max-bytes=65536"}
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet
BIN=${BIN:-target/release/gpusanity}
export GPUSANITY_RDZV_SECRET=${GPUSANITY_RDZV_SECRET:-scale-bench-secret-0123456789}
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, checks $CHECKS"
printf '%6s %9s %-12s %8s %8s %6s %s\n' nodes wall_s exit_codes front back pairs findings
for n in $NODES; do
  out=$(mktemp -d)
  # A free port below the ephemeral range (where the workers' own listeners and connections
  # take theirs), checked free now.
  port=$(python3 -c 'import socket,random
while True:
    p = random.randint(20000, 32000); s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass
    finally: s.close()')
  s=$(date +%s%N)
  pids=()
  for r in $(seq 0 $((n - 1))); do
    # shellcheck disable=SC2086
    "$BIN" check --device cpu --micro-benchmarks "$CHECKS" $PARAMS --nnodes "$n" --node-rank "$r" \
      --nproc-per-node "${NPROC:-1}" --master-addr 127.0.0.1 --master-port "$port" \
      --report-dir "$out/n$r" >"$out/n$r.log" 2>&1 &
    pids+=($!)
  done
  codes=()
  for p in "${pids[@]}"; do
    c=0; wait "$p" || c=$?
    codes+=("$c")
  done
  e=$(date +%s%N)
  wall=$(python3 -c "print(f'{($e - $s) / 1e9:.1f}')")
  summary=$(python3 - "$out/n0/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("- - - no report"); sys.exit()
front = back = pairs = 0
for c in r.get("checks", []):
    for k in c.get("ranks", []):
        m = k.get("metrics", {})
        front += m.get("front_probes", 0); back += m.get("back_probes", 0)
        if c["name"] == "pair-bandwidth" and k["rank"] == 0:
            pairs = m.get("pairs", 0)
f = [x["code"] for x in r.get("findings", [])]
print(int(front), int(back), int(pairs), ",".join(f) or "none")
PY
)
  set -- $summary
  printf '%6s %9s %-12s %8s %8s %6s %s\n' "$n" "$wall" "$(printf '%s\n' "${codes[@]}" | sort | uniq -c | awk '{printf "%sx%s ", $1, $2}')" "$1" "$2" "$3" "${4:-}"
  [ -n "${KEEP:-}" ] && echo "  logs: $out" || rm -rf "$out"
done
