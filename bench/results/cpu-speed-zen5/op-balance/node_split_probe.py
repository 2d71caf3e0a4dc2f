"""Where a cascade-graph step's time goes by OpenVINO node type (PERF_COUNT): 8 decodes with 40 own tokens each on
the 1504-token prefix, and 7 of them + a 100-token turn (experiments.shared_prefix_runs.prefix_with_decoders),
medians over 15 runs after 3. The counters of the run's own request (the cascade graph or its prompt twin: the one
whose total is nearest the wall time).

    PYTHONPATH=. python bench/results/cpu-speed-zen5/op-balance/node_split_probe.py engines/bench-ov-bf16
"""

import pathlib
import statistics
import sys
import time
from collections import defaultdict

from experiments.shared_prefix_runs import PAST, prefix_with_decoders, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40, compile_extra={"PERF_COUNT": True})
dec8 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(8)]
mixed = [("t", token_ids(r, 900, 100), PAST, turn), *dec8[:7]]


def total_ms(req) -> float:
    return sum(p.real_time.total_seconds() for p in req.get_profiling_info()) * 1e3


for name, plan in [("8 decodes", dec8), ("7 decodes + a 100-token turn", mixed)]:
    per, walls = defaultdict(list), []
    for i in range(18):
        t = time.perf_counter()
        r._run(plan, [1] * len(plan), cascade=True)
        wall = (time.perf_counter() - t) * 1e3
        if i < 3:
            continue
        walls.append(wall)
        req = min(
            (q for q in (r.cascade_req, r.cascade_prompt_req) if q is not None),
            key=lambda q: abs(total_ms(q) - wall),
        )
        sums: dict[str, float] = defaultdict(float)
        for p in req.get_profiling_info():
            sums[f"{p.node_type} [{p.exec_type}]"] += p.real_time.total_seconds() * 1e3
        sums["(all nodes)"] = sum(sums.values())
        for k, v in sums.items():
            per[k].append(v)
    med = {k: statistics.median(v) for k, v in per.items()}
    print(f"{name}: wall {statistics.median(walls):.2f} ms; ms by node type [kernel]")
    for k in sorted(med, key=lambda k: -med[k])[:6]:
        print(f"   {med[k]:7.2f}  {k}")
