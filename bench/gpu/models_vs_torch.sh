#!/usr/bin/env bash
# gpusanity's three model checks against a PyTorch reference of the same models on one GPU
# (bench/gpu/torch_models.py: the same shapes as the CUDA defaults, bf16 autocast, fused AdamW,
# SDPA, eager and torch.compile), alternating twice: gpusanity, PyTorch, gpusanity, PyTorch.
# Prints a side-by-side table: per model gpusanity's step time, MFU, mean power and SM clock
# during the timed steps (from report.json), the same for PyTorch eager and compile, and the
# ratios of the step times; then each round's step times, and whether the FLOPs per step and
# parameter counts of the two agree (the same formula, so they must).
#
# Usage (repository root on the GPU machine, release binary built on any x86-64 Linux machine):
#   BIN=target/release/gpusanity OUT=/tmp/mvt bash bench/gpu/models_vs_torch.sh
# Environment: BIN, OUT (raw outputs: gs-N/report.json, gs-N.txt, torch-N.jsonl, torch-N.err),
# GPU (the one GPU used, default 0), MODELS (default mini-gpt,megatron-gpt,resnet), MODES
# (default eager,compile), ROUNDS (default 2), TOTAL_S (the whole script's budget, default 450:
# each PyTorch round gets what is left of it after a reserve for the gpusanity runs still to
# come; a round cut short keeps the JSON lines it printed, the rest shows as "-").
# A dry run of the plumbing on a machine without a GPU (gpusanity's CPU defaults and the
# reference at the same shapes, so that their FLOPs and parameters can be compared):
#   DEVICE=cpu TORCH_ARGS="--device cpu --tiny" bash bench/gpu/models_vs_torch.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-target/release/gpusanity}
OUT=${OUT:-/tmp/gpusanity-models-vs-torch}
MODELS=${MODELS:-mini-gpt,megatron-gpt,resnet}
MODES=${MODES:-eager,compile}
ROUNDS=${ROUNDS:-2}
TOTAL_S=${TOTAL_S:-450}
GS_LIMIT_S=${GS_LIMIT_S:-90}
DEVICE=${DEVICE:-cuda}
read -r -a torch_args <<< "${TORCH_ARGS:-}"
mkdir -p "$OUT"
# shellcheck source=bench/gpu/env.sh
. "$HERE/env.sh"
# gpusanity finds NCCL only as libnccl.so; the pip wheel ships libnccl.so.2 (docs/cuda.md).
if [ -n "${NV:-}" ] && [ -z "$(find "$NV" -name 'libnccl.so')" ]; then
  nccl2=$(find "$NV" -name 'libnccl.so.2' | head -1)
  if [ -n "$nccl2" ]; then
    mkdir -p /tmp/gpusanity-lib && ln -sf "$nccl2" /tmp/gpusanity-lib/libnccl.so
    export LD_LIBRARY_PATH=/tmp/gpusanity-lib:$LD_LIBRARY_PATH
  fi
fi
export CUDA_VISIBLE_DEVICES=${GPU:-0}
if command -v nvidia-smi > /dev/null; then
  nvidia-smi -L
  nvidia-smi -i "$CUDA_VISIBLE_DEVICES" --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
fi
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
"$BIN" --version 2>/dev/null || true

to() { # stdout file, stderr file, then the command (so that `wall` still prints here)
  local o=$1 e=$2; shift 2
  if [ "$o" = "$e" ]; then "$@" > "$o" 2>&1; else "$@" > "$o" 2> "$e"; fi
}

START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: gpusanity $MODELS on $DEVICE $CUDA_VISIBLE_DEVICES (one worker)"
  wall "gpusanity round $round" to "$OUT/gs-$round.txt" "$OUT/gs-$round.txt" timeout -k 5 "$GS_LIMIT_S" \
    "$BIN" check --device "$DEVICE" --nproc-per-node 1 --micro-benchmarks= --model-benchmarks "$MODELS" \
    --report-dir "$OUT/gs-$round"
  grep -E "^(error|Error)|panicked" "$OUT/gs-$round.txt" | head -3
  # What the PyTorch round may take: the budget left, less the gpusanity runs still to come.
  limit=$(( $(left) - (ROUNDS - round) * GS_LIMIT_S / 2 - 10 ))
  if [ "$limit" -lt 20 ]; then
    echo "== round $round: PyTorch skipped, ${limit}s left of TOTAL_S=$TOTAL_S"
    : > "$OUT/torch-$round.jsonl"
    continue
  fi
  echo "== round $round: PyTorch $MODELS ($MODES), at most ${limit}s"
  wall "torch round $round" to "$OUT/torch-$round.jsonl" "$OUT/torch-$round.err" timeout -k 5 "$limit" \
    python3 "$HERE/torch_models.py" --models "$MODELS" --modes "$MODES" "${torch_args[@]}"
  grep -h '"error"' "$OUT/torch-$round.jsonl" || true
  tail -3 "$OUT/torch-$round.err"
done

echo "== total wall $(( $(date +%s) - START )) s"
python3 - "$OUT" "$ROUNDS" "$MODELS" <<'PY'
import json, os, statistics, sys

out, rounds, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")


def gs_round(r):
    """model -> rank 0's metrics (and the check's status) from gpusanity's report.json."""
    try:
        rep = json.load(open(os.path.join(out, f"gs-{r}", "report.json")))
    except (OSError, ValueError) as e:
        print(f"round {r}: no gpusanity report ({e})")
        return {}
    res = {}
    for c in rep.get("checks", []):
        if c.get("ranks"):
            k = c["ranks"][0]
            res[c["name"]] = dict(k.get("metrics", {}), status=c.get("status"), notes=k.get("notes", {}))
    return res


def torch_round(r):
    """(model, mode) -> the JSON line of torch_models.py."""
    res = {}
    try:
        lines = open(os.path.join(out, f"torch-{r}.jsonl")).read().splitlines()
    except OSError:
        return res
    for line in lines:
        try:
            d = json.loads(line)
            res[(d["model"], d["mode"])] = d
        except (ValueError, KeyError):
            pass
    return res


gs = [gs_round(r) for r in range(1, rounds + 1)]
th = [torch_round(r) for r in range(1, rounds + 1)]


def mean_of(values):
    v = [x for x in values if isinstance(x, (int, float))]
    return statistics.fmean(v) if v else None


def fig(d, step, mfu):
    """step ms / MFU % / W / MHz, each the mean over the rounds that have it."""
    s, m = mean_of(x.get(step) for x in d), mean_of(x.get(mfu) for x in d)
    w, c = mean_of(x.get("power_w_mean") for x in d), mean_of(x.get("sm_mhz_mean") for x in d)
    f = lambda v, fmt: fmt % v if v is not None else "-"  # noqa: E731
    return s, "%s / %s / %s / %s" % (f(s, "%.1f"), f(m * 100 if m is not None else None, "%.1f%%"), f(w, "%.0f"), f(c, "%.0f"))


rows = []
for m in models:
    g = [x[m] for x in gs if m in x]
    e = [x[(m, "eager")] for x in th if (m, "eager") in x and "step_ms" in x[(m, "eager")]]
    c = [x[(m, "compile")] for x in th if (m, "compile") in x and "step_ms" in x[(m, "compile")]]
    gs_ms, gs_txt = fig(g, "step_ms_median", "mfu")
    e_ms, e_txt = fig(e, "step_ms", "mfu")
    c_ms, c_txt = fig(c, "step_ms", "mfu")
    failed = lambda mode: any("error" in x.get((m, mode), {}) for x in th)  # noqa: E731
    e_txt, c_txt = ("error" if not v and failed(k) else t for v, t, k in ((e, e_txt, "eager"), (c, c_txt, "compile")))
    ratio = lambda a, b: "%.2fx" % (a / b) if a and b else "-"  # noqa: E731
    rows.append((m, gs_txt, e_txt, c_txt, "%s / %s" % (ratio(gs_ms, e_ms), ratio(gs_ms, c_ms))))

print()
print("step ms / MFU / W / SM MHz: mean over %d rounds; W and MHz averaged over the timed steps" % rounds)
print("ratio: gpusanity step time / PyTorch eager's, / PyTorch compile's (above 1: gpusanity slower)")
head = ("model", "gpusanity", "torch eager", "torch compile", "ratio eager / compile")
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(5)]
line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
print(line(head))
print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
for r in rows:
    print(line(r))

print()
print("step ms per round (gpusanity | eager | compile):")
for m in models:
    cells = []
    for r in range(rounds):
        g = gs[r].get(m, {}).get("step_ms_median")
        e = th[r].get((m, "eager"), {}).get("step_ms")
        c = th[r].get((m, "compile"), {}).get("step_ms")
        cells.append(" | ".join("%.1f" % v if v else "-" for v in (g, e, c)))
    print("  %-13s %s" % (m, "   //   ".join("r%d: %s" % (i + 1, x) for i, x in enumerate(cells))))

print()
print("the same work? FLOPs per step and parameters, gpusanity vs PyTorch (round 1 or the first that has both):")
for m in models:
    g = next((x[m] for x in gs if m in x and "tflops" in x[m]), None)
    t = next((x.get((m, "eager")) or x.get((m, "compile")) for x in th if (m, "eager") in x or (m, "compile") in x), None)
    if not g or not t or "flops_per_step" not in t:
        print("  %-13s -" % m)
        continue
    g_flops = g["tflops"] * 1e12 * g["step_ms_median"] / 1e3
    rel = abs(g_flops - t["flops_per_step"]) / t["flops_per_step"]
    print("  %-13s FLOPs %.4g vs %.4g (%s), params %.0f vs %d, gpusanity %s, power %s"
          % (m, g_flops, t["flops_per_step"], "agree" if rel < 1e-3 else "DIFFER by %.2f%%" % (rel * 100),
             g.get("params", 0), t.get("params", 0), g.get("status"),
             g["notes"].get("power_sampled") or g["notes"].get("power_not_sampled", "-")))
print()
print("PyTorch runs: build, compilation and warm-up steps; the power reading; errors:")
for r, x in enumerate(th):
    for (m, mode), d in x.items():
        if "error" in d:
            print("  round %d %-13s %-7s ERROR %s" % (r + 1, m, mode, d["error"][:300]))
            continue
        print("  round %d %-13s %-7s warm-up %5.1f s, %s samples of %s%s"
              % (r + 1, m, mode, d.get("warmup_s", 0), d.get("power_samples", 0), d.get("power_source"),
                 ", NVML: " + d["nvml_error"] if d.get("nvml_error") else ""))
PY
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)|torch_models.py" || echo none
