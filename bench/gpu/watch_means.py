"""How much steadier the watch's interval means are than one reading (docs/watch.md).

Reads recordings of `bench/gpu/watch_train.py --telemetry FILE` and prints, over the busy
samples of the training phase, the coefficient of variation of the SM clock read once at each
line (`sm_mhz`) against the mean of the readings every 0.1 s within its period
(`sm_mean_mhz`, as the agent's sampler reads it), and the same of the power (`power_w`,
`power_mean_w`).

  python3 bench/gpu/watch_means.py tele.jsonl [more.jsonl ...]
"""
import json,statistics as st,sys
for f in sys.argv[1:]:
    try: rows=[json.loads(l) for l in open(f) if '"error"' not in l]
    except FileNotFoundError: print(f, "missing"); continue
    tr=[r for r in rows if r.get("phase","train")=="train" and (r.get("util") or 0)>=90 and r.get("sm_mean_mhz")]
    def cv(v): return st.pstdev(v)/st.fmean(v) if len(v)>1 else 0
    a=[r["sm_mhz"] for r in tr]; b=[r["sm_mean_mhz"] for r in tr]; p=[r["power_w"] for r in tr]; q=[r["power_mean_w"] for r in tr if r.get("power_mean_w")]
    n=[r["clk_samples"] for r in tr]
    print(f, "rows", len(rows), "train-busy", len(tr))
    if tr: print(" clock: one reading cv %.4f min %d; mean of %s cv %.4f min %.0f; power: one %.4f, mean %.4f"%(cv(a),min(a),st.median(n),cv(b),min(b),cv(p),cv(q) if q else -1))
