"""A lone sequence's 9-token run, three ways (issue 30, c=1): its token + 8 drafts (one sequence), its token + 8
tokens of run padding (runtime.run_padding: a second sequence in the padding block), and its token alone; each
steady, medians of REPS runs, three rounds in turn.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/pad_shape_probe.py engines/smollm2-ov-bf16 300
"""

import pathlib
import statistics
import sys
import time

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
REPS = 24
r = OpenVinoPagedRunner(folder.openvino_model(), 8, 4096, None, 0, folder.recipe().precision, cascade=False)
r.padding.limit = 0
table = tuple(range(0, 60))
r._run([("s0", tuple(range(3, 3 + PAST)), 0, table)], [1])
pad = ("", (0,) * 8, 0, (r._pad_block,))
SHAPES = {
    "token + 8 drafts (rows 9)": ([("s0", tuple(range(5, 14)), PAST, table)], [9]),
    "token + 8 drafts (rows 1)": ([("s0", tuple(range(5, 14)), PAST, table)], [1]),
    "token + 8 padding (rows 1)": ([("s0", (5,), PAST, table), pad], [1, 0]),
    "token alone (rows 1)": ([("s0", (5,), PAST, table)], [1]),
}


def steady(seqs, rows):
    ts = []
    for _ in range(REPS + 2):
        a = time.perf_counter()
        r._run(seqs, rows)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts[2:])


print(f"{folder.path.name}, past {PAST}, medians of {REPS} steady runs (ms)")
for rnd in range(3):
    print(f"round {rnd + 1}: " + " | ".join(f"{k} {steady(*v):.2f}" for k, v in SHAPES.items()), flush=True)
