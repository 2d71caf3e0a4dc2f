"""Does a change of a run's token count cost per compiled graph? (bench/results/prompt-graph/README.md)

    PYTHONPATH=. python bench/results/prompt-graph/graph_probe.py engines/smollm2-ov-bf16 100

8 decodes on a shared 1504-token past (the cascade graph), three decode runs after every mixed run (the same 8
decodes + a prompt of N-N+5 tokens); the mixed runs on the same compiled graph ("one graph"), on a second infer
request of it ("two requests") or on a second compilation of it ("two graphs"); ms, medians of 16 cycles: the first decode after a mixed run, every decode, the
mixed runs, and 9 decodes in a row."""

import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import cascade_runner, decodes, mixed
from llmkiln.engine_dir import EngineDir

folder = EngineDir(pathlib.Path(sys.argv[1]))
PROMPT = int(sys.argv[2])
A, B = cascade_runner(folder), cascade_runner(folder)
second = A._bind_pools(A.cascade_compiled.create_infer_request())


def timed(r, items, req=None):
    first = r.cascade_req
    r.cascade_req = req or first
    a = time.perf_counter()
    r._run(*items, cascade=True)
    r.cascade_req = first
    return (time.perf_counter() - a) * 1000


for rnd in range(3):
    for mode in ("one graph", "two requests", "two graphs"):
        d, m = [], []
        for k in range(16):
            n = PROMPT + (0, 3, 5, 1)[k % 4]
            d += [timed(A, decodes()) for _ in range(3)]
            if mode == "two graphs":
                m.append(timed(B, mixed(n)))
            else:
                m.append(timed(A, mixed(n), second if mode == "two requests" else None))
        steady = [timed(A, decodes()) for _ in range(9)]
        print(
            f"round {rnd} {mode:12s}: decode after mixed {statistics.median(d[0::3]):.1f}, every decode "
            f"{statistics.median(d):.1f}, mixed {statistics.median(m):.1f}, decodes in a row "
            f"{statistics.median(steady):.1f}",
            flush=True,
        )
