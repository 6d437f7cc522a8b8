#!/usr/bin/env bash
# The CPU's own GEMM speed against a paced device's (GPUSANITY_TEST_PACE), side by side: PAIRS
# pairs (default 60) of one-rank GEMM checks of the fleet tests' size (256^3 x 40 products),
# one unpaced (its figure per CPU-second, what a fleet judges on CPU workers), one paced at
# PACE MFLOP/s (default 10000; per wall second), alternated. Prints each kind's median, 10th
# percentile, least and spread (MAD x 1.4826 over the median): the fleet test's devices must
# spread like an H200 fleet (about 0.6%), the host's own figures show what a fleet on it would
# learn (docs/fleet.md, "Tests").
set -eu
cd "$(dirname "$0")/.."
PAIRS=${PAIRS:-60}
PACE=${PACE:-10000}
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet
BIN=${BIN:-target/release/gpusanity}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(check --device cpu --test-faults --micro-benchmarks=gemm --check-param gemm.size=256 --check-param gemm.iters=40)
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $PAIRS pairs, pace $PACE MFLOP/s"
for i in $(seq "$PAIRS"); do
  env -u GPUSANITY_TEST_PACE "$BIN" "${args[@]}" --report-dir "$out/host$i" > "$out/host$i.log" 2>&1 ||
    echo "pair $i, host: exit $? ($(tail -1 "$out/host$i.log"))"
  GPUSANITY_TEST_PACE=$PACE "$BIN" "${args[@]}" --report-dir "$out/paced$i" > "$out/paced$i.log" 2>&1 ||
    echo "pair $i, paced: exit $? ($(tail -1 "$out/paced$i.log"))"
done
python3 - "$out" "$PAIRS" <<'PY'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def figure(kind, i, key):
    try:
        r = json.load(open(f"{out}/{kind}{i}/report.json"))
        [gemm] = [c for c in r["checks"] if c["name"] == "gemm"]
        return gemm["ranks"][0]["metrics"][key] * 1e3, r["ranks"][0]["device"]
    except (OSError, KeyError, ValueError, IndexError):
        return None
for kind, key, unit in (("host", "tflops_cpu", "GFLOP/s per CPU-second"), ("paced", "tflops", "GFLOP/s")):
    got = [f for f in (figure(kind, i, key) for i in range(1, pairs + 1)) if f]
    if len(got) < pairs:
        print(f"{kind}: {pairs - len(got)} of {pairs} runs left no figure")
    if not got:
        continue
    v = sorted(x for x, _ in got)
    med = statistics.median(v)
    mad = statistics.median(abs(x - med) for x in v) * 1.4826
    print(f"{kind:5} ({got[0][1]}): median {med:.2f} {unit}, 10th percentile {v[len(v) // 10]:.2f}, "
          f"least {v[0]:.2f}, most {v[-1]:.2f}, spread {100 * mad / med:.2f}% of the median")
PY
