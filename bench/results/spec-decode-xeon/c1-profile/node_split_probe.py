"""Where 8 more tokens go in a lone sequence's run: OpenVINO's own per-node timing (PERF_COUNT) of the runner's
graph, summed by node type (and kernel), medians over REPS steady runs, for the token alone and with 8 drafts (9
logits rows) on a 300-token past
(experiments.lone_sequence_runs).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/node_split_probe.py engines/smollm2-ov-bf16 300
"""

import pathlib
import statistics
import sys
from collections import defaultdict

from experiments.lone_sequence_runs import REPS, alone, drafted, lone_runner
from experiments.shared_prefix_runs import Run
from llmkiln.engine_dir import EngineDir

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
r = lone_runner(folder, PAST, compile_extra={"PERF_COUNT": True})
SHAPES = {"token alone": alone(PAST), "token + 8 drafts (rows 9)": drafted(PAST)}


def split(run: Run) -> dict[str, float]:
    per: dict[str, list[float]] = defaultdict(list)
    for i in range(REPS + 2):
        r._run(*run)
        if i < 2:
            continue
        sums: dict[str, float] = defaultdict(float)
        for p in r.req.get_profiling_info():
            sums[f"{p.node_type} [{p.exec_type}]"] += p.real_time.total_seconds() * 1000
        sums["(all nodes)"] = sum(sums.values())
        for k, v in sums.items():
            per[k].append(v)
    return {k: statistics.median(v) for k, v in per.items()}


print(f"{folder.path.name}, past {PAST}, medians of {REPS} runs, ms by node type [kernel]")
for rnd in range(2):
    a, b = (split(v) for v in SHAPES.values())
    rows = sorted(set(a) | set(b), key=lambda k: -max(a.get(k, 0), b.get(k, 0)))
    print(f"round {rnd + 1}: node type [kernel] | token alone | + 8 drafts | difference")
    for k in rows[:12]:
        print(f"  {k} | {a.get(k, 0):.2f} | {b.get(k, 0):.2f} | {b.get(k, 0) - a.get(k, 0):+.2f}")
