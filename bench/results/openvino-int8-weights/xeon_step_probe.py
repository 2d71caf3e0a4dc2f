"""int8 weights against bf16 on the Intel Xeon with AMX, one run at a time (README.md, "On the Intel Xeon"):

    PYTHONPATH=. python bench/results/openvino-int8-weights/xeon_step_probe.py engines/smollm2-ov-bf16 \
        engines/smollm2-ov-bf16-int8

8 decodes on a shared 1504-token past, the same + a 100- or 32-token prompt (cascade graph), and a fresh
1600-token prompt; medians of 9 runs (3 for the prefill), ms, three rounds."""

import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import TABLES, cascade_runner, decodes, mixed
from llmkiln.engine_dir import EngineDir

runners = {}
for e in sys.argv[1:]:
    r = runners[e] = cascade_runner(EngineDir(pathlib.Path(e)))
    print(
        e,
        r.runtime_settings.get("weights"),
        r.runtime_settings.get("DYNAMIC_QUANTIZATION_GROUP_SIZE"),
        flush=True,
    )


def t(r, items, reps=9):
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        r._run(*items, cascade=True)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts)


for rnd in range(3):
    for e, r in runners.items():
        prefill = ([("q", tuple(range(9, 1609)), 0, TABLES[8])], [1])
        print(
            f"{rnd} {pathlib.Path(e).name:22s} decode8 {t(r, decodes()):.1f} mixed+100 {t(r, mixed(100)):.1f} "
            f"mixed+32 {t(r, mixed(32)):.1f} prefill1600 {t(r, prefill, 3):.0f}",
            flush=True,
        )
