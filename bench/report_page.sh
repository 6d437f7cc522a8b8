#!/usr/bin/env bash
# Render time and size of the HTML run page for a large job: takes the example report
# (docs/examples/report-cpu.json, a real 3-rank CPU run of every check), widens it to RANKS ranks
# on RANKS/8 nodes by repeating the measured ranks' results (figures unchanged, rank numbers
# and hosts new), and times `gpusanity report` on it (command start to exit, N runs, median).
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-512}
N=${N:-5}
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$RANKS" docs/examples/report-cpu.json "$work/big.json" <<'PY'
import copy, json, sys
n = int(sys.argv[1])
r = json.load(open(sys.argv[2]))
per = 8
nodes = max(1, n // per)
r["nodes"] = [{"node_rank": i, "hostname": "node%03d" % i, "addr": "10.0.%d.%d" % (i // 250, i % 250), "nproc": per} for i in range(nodes)]
dev = r["ranks"][0]["device"]
r["ranks"] = [{"rank": k, "node_rank": k // per, "local_rank": k % per, "host": "node%03d" % (k // per), "device": dev, "pid": 1000 + k} for k in range(n)]
for c in r["checks"]:
    src = c["ranks"]
    c["ranks"] = []
    for k in range(n):
        x = copy.deepcopy(src[k % len(src)])
        x["rank"] = k
        c["ranks"].append(x)
json.dump(r, open(sys.argv[3], "w"))
PY
times=()
for i in $(seq "$N"); do
  s=$(date +%s%N)
  target/release/gpusanity report "$work/big.json" -o "$work/big.html" > /dev/null
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000000 )))
done
# The page's load in headless Chromium (when installed): wall time of --dump-dom on the page,
# and on an empty page for the browser's own start, median of N each.
load_ms() {
  local ts=() f=$1
  for i in $(seq "$N"); do
    local s e
    s=$(date +%s%N)
    chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
      --user-data-dir="$work/profile" --dump-dom "file://$f" > /dev/null 2>&1
    e=$(date +%s%N)
    ts+=($(( (e - s) / 1000000 )))
  done
  printf '%s\n' "${ts[@]}" | sort -n | sed -n "$(( (N + 1) / 2 ))p"
}
sorted=$(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')
median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (N + 1) / 2 ))p")
echo "$RANKS ranks, $(wc -c < "$work/big.json") bytes of JSON -> $(wc -c < "$work/big.html") bytes of HTML," \
  "$(grep -o '<svg' "$work/big.html" | wc -l) charts; render median ${median} ms (runs: ${sorted}ms; $(nproc) cores, $(date -u +%Y-%m-%d))"
if command -v chromium > /dev/null; then
  echo '<!doctype html><title>empty</title>' > "$work/empty.html"
  echo "headless Chromium: the page loads in $(load_ms "$work/big.html") ms, an empty page in $(load_ms "$work/empty.html") ms (median of $N)"
fi
