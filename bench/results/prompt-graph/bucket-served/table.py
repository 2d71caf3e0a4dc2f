"""Medians over rounds of bench/results/prompt-graph/bucket-served: base (recipe as is), twin (prompt_graph on), bucket
(prompt_graph on and every prompt run on the twin padded to a multiple of 16 tokens; a probe build, not kept).

    python bench/results/prompt-graph/bucket-served/table.py bench/results/prompt-graph/bucket-served
"""

import collections
import glob
import json
import statistics
import sys

root = sys.argv[1]
rows: dict[tuple[str, int], dict[int, dict]] = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{root}/*-k*/summary.json")):
    v, k = f.split("/")[-2].split("-k")
    d = json.load(open(f))
    for c, lv in d["systems"]["bench-ov-bf16/dynamo"]["levels"].items():
        rows[(v, int(c))][int(k)] = lv


def m(lv: dict, key: tuple[str, str | None]) -> float:
    a, b = key
    return lv[a][b] if b else lv[a]


keys = [("ttft_ms", "p50"), ("ttft_ms", "p95"), ("itl_ms", "p50"), ("itl_ms", "p99"), ("output_tok_s", None)]
for (v, c), ks in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    cells = []
    for a, b in keys:
        med = statistics.median(m(lv, (a, b)) for lv in ks.values())
        each = " ".join(f"{m(ks[k], (a, b)):.0f}" for k in sorted(ks))
        cells.append(f"{a.split('_')[0]} {b or 'tok/s'}: med {med:6.1f} [{each}]")
    print(f"{v:7s} c={c:2d} " + "  ".join(cells))
