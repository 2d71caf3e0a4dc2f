"""A lone sequence's run, steady, for 14 s after the compile (MODE 1: its token alone; 9: with 8 drafts, one logits
row), for `perf record -p PID` once /tmp/perf_ready_MODE exists (c1-profile/perf.out has the commands and the split).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/perf_loop.py engines/smollm2-ov-bf16 MODE
"""

import pathlib
import sys
import time

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import openvino_runner

folder = EngineDir(pathlib.Path(sys.argv[1]))
mode = sys.argv[2]
PAST = 300
r = openvino_runner.OpenVinoPagedRunner(
    folder.openvino_model(), 8, 4096, None, 0, folder.recipe().precision, cascade=False
)
r.padding.limit = 0
table = tuple(range(0, 60))
r._run([("s0", tuple(range(3, 3 + PAST)), 0, table)], [1])
seqs, rows = (
    ([("s0", (5,), PAST, table)], [1]) if mode == "1" else ([("s0", tuple(range(5, 14)), PAST, table)], [1])
)
for _ in range(20):
    r._run(seqs, rows)
pathlib.Path(f"/tmp/perf_ready_{mode}").write_text("1")
n = 0
t = time.perf_counter()
while time.perf_counter() - t < 14:
    r._run(seqs, rows)
    n += 1
print(mode, "runs", n, "ms/run %.2f" % ((time.perf_counter() - t) * 1000 / n))
