"""A lone sequence's 9-token run, three ways (issue 30, c=1): its token + 8 drafts (one sequence), its token + 8
tokens of run padding (runtime.run_padding: a second sequence in the padding block), and its token alone; each
steady, medians of REPS runs, three rounds in turn (experiments.lone_sequence_runs).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/pad_shape_probe.py engines/smollm2-ov-bf16 300
"""

import pathlib
import sys

from experiments.lone_sequence_runs import REPS, alone, drafted, lone_runner, padded, steady
from llmkiln.engine_dir import EngineDir

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
r = lone_runner(folder, PAST)
SHAPES = {
    "token + 8 drafts (rows 9)": drafted(PAST),
    "token + 8 drafts (rows 1)": drafted(PAST, rows=1),
    "token + 8 padding (rows 1)": padded(r, PAST),
    "token alone (rows 1)": alone(PAST),
}
print(f"{folder.path.name}, past {PAST}, medians of {REPS} steady runs (ms)")
for rnd in range(3):
    print(f"round {rnd + 1}: " + " | ".join(f"{k} {steady(r, v):.2f}" for k, v in SHAPES.items()), flush=True)
