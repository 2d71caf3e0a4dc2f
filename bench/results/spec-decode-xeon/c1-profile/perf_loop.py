"""A lone sequence's run, steady, for 14 s after the compile (MODE 1: its token alone; 9: with 8 drafts, one logits
row), for `perf record -p PID` once /tmp/perf_ready_MODE exists (c1-profile/perf.out has the commands and the split).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/perf_loop.py engines/smollm2-ov-bf16 MODE
"""

import pathlib
import sys
import time

from experiments.lone_sequence_runs import alone, drafted, lone_runner
from llmkiln.engine_dir import EngineDir

folder = EngineDir(pathlib.Path(sys.argv[1]))
mode = sys.argv[2]
PAST = 300
r = lone_runner(folder, PAST)
run = alone(PAST) if mode == "1" else drafted(PAST, rows=1)
for _ in range(20):
    r._run(*run)
pathlib.Path(f"/tmp/perf_ready_{mode}").write_text("1")
n = 0
t = time.perf_counter()
while time.perf_counter() - t < 14:
    r._run(*run)
    n += 1
print(mode, "runs", n, f"ms/run {(time.perf_counter() - t) * 1000 / n:.2f}")
