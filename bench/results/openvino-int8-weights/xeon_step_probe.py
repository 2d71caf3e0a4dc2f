"""int8 weights against bf16 on the Intel Xeon with AMX, one run at a time (README.md, "On the Intel Xeon"):

    PYTHONPATH=. python bench/results/openvino-int8-weights/xeon_step_probe.py engines/smollm2-ov-bf16 \
        engines/smollm2-ov-bf16-int8

8 decodes on a shared 1504-token past, the same + a 100- or 32-token prompt (cascade graph), and a fresh
1600-token prompt; medians of 9 runs (3 for the prefill), ms, three rounds."""

import pathlib
import statistics
import sys
import time

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

PAST = 1504
runners = {}
for e in sys.argv[1:]:
    f = EngineDir(pathlib.Path(e))
    r = OpenVinoPagedRunner(f.openvino_model(), 9, 2048, None, 0, f.recipe().precision, cascade=True)
    r.padding.limit = 0
    runners[e] = r
    print(
        e,
        r.runtime_settings.get("weights"),
        r.runtime_settings.get("DYNAMIC_QUANTIZATION_GROUP_SIZE"),
        flush=True,
    )
shared = tuple(range(47))
tables = [shared + tuple(range(100 + i * 20, 120 + i * 20)) for i in range(9)]
for r in runners.values():
    r._run([("s0", tuple(range(3, 3 + PAST)), 0, tables[0])], [1])


def decodes():
    return [(f"s{i}", (7,), PAST, tables[i]) for i in range(8)], [1] * 8


def mixed(n):
    seqs, rows = decodes()
    return [("p", tuple(range(5, 5 + n)), PAST, tables[8]), *seqs], [1, *rows]


def t(r, items, reps=9):
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        r._run(*items, cascade=True)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts)


for rnd in range(3):
    for e, r in runners.items():
        prefill = ([("q", tuple(range(9, 1609)), 0, tables[8])], [1])
        print(
            f"{rnd} {pathlib.Path(e).name:22s} decode8 {t(r, decodes()):.1f} mixed+100 {t(r, mixed(100)):.1f} "
            f"mixed+32 {t(r, mixed(32)):.1f} prefill1600 {t(r, prefill, 3):.0f}",
            flush=True,
        )
