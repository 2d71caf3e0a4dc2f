"""Decode-only step times by rows, and mixed steps (a prompt of 60+ tokens), from a step profile (LLMKILN_PROFILE):
python bench/results/cpu-speed-zen5/ttft/contention/step_shapes.py PROFILE.jsonl"""

import collections
import json
import statistics
import sys

steps = [json.loads(line) for line in open(sys.argv[1]) if '"step"' in line]
by_rows = collections.defaultdict(list)
for s in steps:
    if not s["prefill"] and s["decode"]:
        by_rows[s["decode"][0]].append(s["decode"][3] / 1000)
for rows in sorted(by_rows):
    v = sorted(by_rows[rows])
    p50, p10, p90 = statistics.median(v), v[len(v) // 10], v[len(v) * 9 // 10]
    print(rows, len(v), f"p50 {p50:.1f} p10 {p10:.1f} p90 {p90:.1f}")
mixed = [s["total_us"] / 1000 for s in steps if s["prefill"] and s["prefill"][0][1] >= 60]
print("mixed(>=60 tok)", len(mixed), f"p50 {statistics.median(mixed):.1f}")
