"""The runner's _run against req.infer() again on the inputs already bound (a lone sequence on a 300-token past;
the token alone, 9 tokens with 9 or 1 logits rows), medians of 24, three rounds
(experiments.lone_sequence_runs).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/infer_only_probe.py engines/smollm2-ov-bf16
"""

import pathlib
import sys

from experiments.lone_sequence_runs import alone, drafted, lone_runner, median_ms, steady
from experiments.shared_prefix_runs import Run
from llmkiln.engine_dir import EngineDir

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = 300
r = lone_runner(folder, PAST)
SH = {"alone": alone(PAST), "9 rows9": drafted(PAST), "9 rows1": drafted(PAST, rows=1)}


def infer_again(run: Run) -> float:
    """req.infer() repeated on the inputs `run` bound."""
    r._run(*run)
    return median_ms(r.req.infer)


for _ in range(3):
    print(
        " | ".join(f"{k}: run {steady(r, v):.2f} infer {infer_again(v):.2f}" for k, v in SH.items()),
        flush=True,
    )
