"""Around the longest gap between two tokens of a served level: the engine's steps (LLMKILN_PROFILE's step
records) and every stream's token arrivals at the client (cpu_peers' raw records), on one wall clock.

    LLMKILN_PROFILE=PROFILE.jsonl python -m experiments.cpu_peers --out OUT --recipes bench-ov-bf16 \\
        --systems bench-ov-bf16/dynamo --user-tokens 30-40 --set scheduler.max_batch_size=32 --concurrency 8 \\
        --requests 64 --warmup 16 --output-spread 16
    python bench/results/cpu-speed-zen5/ttft/delivery-stall/delivery_stall.py OUT/raw/bench-ov-bf16-dynamo.jsonl \\
        PROFILE.jsonl [CONCURRENCY]
"""

import json
import sys

raw, profile = sys.argv[1], sys.argv[2]
conc = int(sys.argv[3]) if len(sys.argv) > 3 else 8
rows = [r for r in map(json.loads, open(raw)) if r["concurrency"] == conc]
t0 = min(r["send_wall_ns"] for r in rows) / 1e9
arrivals = {}
for r in rows:
    off = r["send_wall_ns"] - r["send_ns"]
    arrivals[r["index"]] = [(t + off) / 1e9 - t0 for t in r["token_ns"]]
gap, at = max(
    ((b - a, a) for ts in arrivals.values() for a, b in zip(ts, ts[1:], strict=False)), default=(0.0, 0.0)
)
lo, hi = at - 0.15, at + gap + 0.1
print(f"level c={conc}: {len(rows)} requests; the longest gap {gap * 1e3:.1f} ms from +{at:.3f} s")
print("engine steps (start, ms, prompt tokens, decode rows, running):")
for s in map(json.loads, open(profile)):
    if s.get("kind") != "step" or not lo <= s["t"] / 1e9 - t0 <= hi:
        continue
    prompt = sum(p[1] for p in s["prefill"] or [])
    rows_ = (s["decode"] or [0])[0]
    print(f"  +{s['t'] / 1e9 - t0:.3f}  {s['total_us'] / 1e3:5.1f}  {prompt:4d}  {rows_:2d}  {s['running']}")
print("token arrivals at the client (request: times):")
for i, ts in sorted(arrivals.items()):
    sel = [f"{t:.3f}" for t in ts if lo <= t <= hi]
    if sel:
        print(f"  {i}: {' '.join(sel)}")
