"""Which hop held a burst (README.md, "One caught"): the client's records of the level, the worker's and the front's
per-token stamps (hop-stamps.patch, $LLMKILN_X_TOKLOG), the benchmark process's heartbeat and collector logs
(gc_log_sitecustomize.py).

    python burst_hops.py OUT/raw/bench-ov-bf16-dynamo.jsonl TOKLOG-front-PID.jsonl TOKLOG-worker-PID.jsonl \\
        /tmp/gcsite/beat-PID.log /tmp/gcsite/gc-PID.log      (PID: the benchmark process's, the worker's)

A burst: a stream waits over 80 ms, then gets 3+ tokens within 2 ms.
"""

import bisect
import json
import sys

raw, front_log, worker_log, beat_log, gc_log = sys.argv[1:6]
rows = [r for r in map(json.loads, open(raw)) if r["concurrency"] == 8]
t0 = min(r["send_wall_ns"] for r in rows) / 1e9
t1 = max(r["send_wall_ns"] + r["end_ns"] - r["send_ns"] for r in rows) / 1e9 - t0
streams = []
for r in rows:
    off = r["send_wall_ns"] - r["send_ns"]
    streams.append([(x + off) / 1e9 - t0 for x in r["token_ns"]])
bursts = sorted(
    (ts[i - 1], ts[i])
    for ts in streams
    for i in range(1, len(ts) - 2)
    if ts[i] - ts[i - 1] > 0.08 and ts[i + 2] - ts[i] < 0.002
)
events: list[list[float]] = []
for a, b in bursts:
    if not events or a - events[-1][0] > 0.05:
        events.append([a, b, 1])
    else:
        events[-1][2] += 1
print(
    f"level {t1:.1f} s; bursts (gap start, end, streams):",
    [(round(a, 3), round(b, 3), n) for a, b, n in events],
)
front = sorted(t / 1e9 - t0 for line in open(front_log) for t, _ in json.loads(line)["log"])
sent = sorted(t / 1e9 - t0 for line in open(worker_log) for k, t in json.loads(line)["log"] if k == "sent")
beats = [(float(x.split()[0]) - t0, float(x.split()[1])) for x in open(beat_log)]
gcs = [(float(x.split()[0]) - t0, x.split()[1], float(x.split()[2])) for x in open(gc_log)]


def inside(xs: list[float], a: float, b: float) -> int:
    return bisect.bisect_left(xs, b) - bisect.bisect_left(xs, a)


for a, b, n in events:
    print(
        f"burst {a:.3f}->{b:.3f} ({(b - a) * 1e3:.0f} ms, {n} streams): worker sent {inside(sent, a + 0.005, b - 0.002)}"
        f" tokens inside, front received {inside(front, a + 0.005, b - 0.002)} chunks inside; benchmark-process "
        f"heartbeat gaps: {[(round(t, 3), g) for t, g in beats if a - 0.05 < t < b]}; collections (end, generation, "
        f"ms): {[(round(t, 3), g, ms) for t, g, ms in gcs if a - 0.2 < t < b + 0.05]}"
    )
