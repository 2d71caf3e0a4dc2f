"""Run-shape probe (bench/results/spec-decode-xeon/README.md, "K = 8 and padding to it"):
`python bench/results/spec-decode-xeon/k8-padding/shape_probe.py engines/smollm2-ov-bf16 300` (PAST = 300)."""

import pathlib
import statistics
import sys
import time

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
r = OpenVinoPagedRunner(folder.openvino_model(), 8, 4096, None, 0, folder.recipe().precision, cascade=False)
r.padding.limit = 0
print("block size", r.block_size)
tables = [tuple(range(i * 60, i * 60 + 60)) for i in range(8)]
r._run([("s0", tuple(range(3, 3 + PAST)), 0, tables[0])], [1])


def pf(n):
    return [("s0", tuple(range(5, 5 + n)), PAST, tables[0])]


def t(n, rows, reps=15):
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        r._run(pf(n), [rows])
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts)


for _ in range(3):
    print("steady rows=all ", " ".join(f"{n}:{t(n, n):.1f}" for n in (1, 2, 3, 5, 9)), flush=True)
    print("steady rows=1   ", " ".join(f"{n}:{t(n, 1):.1f}" for n in (1, 2, 3, 5, 9)), flush=True)
    ts = []
    for k in range(24):
        n = (1, 5, 3, 9, 2, 5)[k % 6]
        a = time.perf_counter()
        r._run(pf(n), [n])
        ts.append((time.perf_counter() - a) * 1000)
    print("changing 1-9:", f"{statistics.median(ts):.1f}", flush=True)
