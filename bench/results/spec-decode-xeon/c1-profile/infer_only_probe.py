"""The runner's _run against req.infer() again on the inputs already bound (a lone sequence on a 300-token past;
the token alone, 9 tokens with 9 or 1 logits rows), medians of 24, three rounds.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/infer_only_probe.py engines/smollm2-ov-bf16
"""

import pathlib
import statistics
import sys
import time

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import openvino_runner

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = 300
r = openvino_runner.OpenVinoPagedRunner(
    folder.openvino_model(), 8, 4096, None, 0, folder.recipe().precision, cascade=False
)
r.padding.limit = 0
table = tuple(range(0, 60))
r._run([("s0", tuple(range(3, 3 + PAST)), 0, table)], [1])
SH = {
    "alone": ([("s0", (5,), PAST, table)], [1]),
    "9 rows9": ([("s0", tuple(range(5, 14)), PAST, table)], [9]),
    "9 rows1": ([("s0", tuple(range(5, 14)), PAST, table)], [1]),
}


def t(seqs, rows, infer_only):
    r._run(seqs, rows)
    r._run(seqs, rows)
    ts = []
    for _ in range(24):
        a = time.perf_counter()
        if infer_only:
            r.req.infer()
        else:
            r._run(seqs, rows)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts)


for _ in range(3):
    print(
        " | ".join(f"{k}: run {t(*v, False):.2f} infer {t(*v, True):.2f}" for k, v in SH.items()), flush=True
    )
