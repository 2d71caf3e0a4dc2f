"""Run-shape probe (bench/results/spec-decode-xeon/README.md, "K = 8 and padding to it"):
`python bench/results/spec-decode-xeon/k8-padding/pad_probe.py engines/smollm2-ov-bf16 300` (PAST = 300)."""

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
tables = [tuple(range(i * 60, i * 60 + 60)) for i in range(8)]
r._run([("s0", tuple(range(3, 3 + PAST)), 0, tables[0])], [1])


def real(n):
    return ([("s0", tuple(range(5, 5 + n)), PAST, tables[0])], [n])


def padded(n, to):
    return (
        [("s0", tuple(range(5, 5 + n)), PAST, tables[0]), ("", (0,) * (to - n), 0, (r._pad_block,))],
        [n, 0],
    )


def run(pattern, reps=24):
    ts = []
    for k in range(reps):
        seqs, rows = pattern[k % len(pattern)]
        a = time.perf_counter()
        r._run(seqs, rows)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts)


for _ in range(3):
    res = {
        "1 real": run([real(1)]),
        "5 real": run([real(5)]),
        "1+4pad": run([padded(1, 5)]),
        "alt 1/5 real": run([real(1), real(5)]),
        "alt 1+4pad/5 real": run([padded(1, 5), real(5)]),
        "alt 2+3pad/5 real": run([padded(2, 5), real(5)]),
        "alt 3+2pad/1+4pad": run([padded(3, 5), padded(1, 5)]),
    }
    print(" | ".join(f"{k}: {v:.1f}" for k, v in res.items()), flush=True)
