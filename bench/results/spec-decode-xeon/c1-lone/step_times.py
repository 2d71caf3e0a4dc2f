"""Per decode step of a c=1 stepped run, from the raw token stamps (a step = the tokens stamped together): steps,
median / mean gap (ms), the gaps that gave 1 token and those that gave more, tokens a step.

    python bench/results/spec-decode-xeon/c1-lone/step_times.py RUN/raw/SYSTEM-WORKLOAD.jsonl ...
"""

import json
import statistics as st
import sys
from collections import Counter

for f in sys.argv[1:]:
    gaps: dict[int, list[float]] = {1: [], 2: []}
    sizes: Counter[int] = Counter()
    for line in open(f, encoding="utf-8"):
        groups: list[list[int]] = []
        for t in json.loads(line)["token_ns"]:
            if groups and groups[-1][0] == t:
                groups[-1][1] += 1
            else:
                groups.append([t, 1])
        for (a, _), (b, n) in zip(groups, groups[1:], strict=False):
            gaps[1 if n == 1 else 2].append((b - a) / 1e6)
            sizes[n] += 1
    every = gaps[1] + gaps[2]
    print(
        f"{f}: {len(every)} steps, median {st.median(every):.2f} mean {st.fmean(every):.2f} ms | "
        f"1 token {len(gaps[1])} median {st.median(gaps[1] or [0]):.2f} | "
        f"more {len(gaps[2])} median {st.median(gaps[2] or [0]):.2f} | "
        f"tokens a step {sum(n * c for n, c in sizes.items()) / sum(sizes.values()):.2f}"
    )
