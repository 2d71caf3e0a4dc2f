"""The runner's _run taken apart: building the feeds, binding them, infer, the logits copy; a lone sequence on a
300-token past, the token alone and with 8 drafts (9 rows), medians of 24, three rounds
(experiments.lone_sequence_runs). A stand-in for the runner's infer request stamps the time of the first
set_tensor, of infer's start and end, and _run's return; the phases are the gaps.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/run_split_probe.py engines/smollm2-ov-bf16
"""

import pathlib
import statistics
import sys
import time

import openvino as ov

from experiments.lone_sequence_runs import REPS, alone, drafted, lone_runner
from experiments.shared_prefix_runs import Run
from llmkiln.engine_dir import EngineDir


class Stamps:
    """The request, stamping perf_counter at the first set_tensor of a run and around infer."""

    def __init__(self, req: ov.InferRequest) -> None:
        self._req = req
        self.first_set: float | None = None
        self.infer_start = self.infer_end = 0.0

    def set_tensor(self, name: str, tensor: ov.Tensor) -> None:
        if self.first_set is None:
            self.first_set = time.perf_counter()
        self._req.set_tensor(name, tensor)

    def infer(self) -> None:
        self.infer_start = time.perf_counter()
        self._req.infer()
        self.infer_end = time.perf_counter()

    def __getattr__(self, name: str):
        return getattr(self._req, name)


folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = 300
r = lone_runner(folder, PAST, wrap=Stamps)
stamps: Stamps = r.req  # type: ignore[assignment]


def split(run: Run) -> list[float]:
    """Median ms of: the feeds, binding them, infer, the logits copy."""
    phases = []
    for i in range(REPS + 2):
        stamps.first_set = None
        t0 = time.perf_counter()
        r._run(*run)
        t1 = time.perf_counter()
        assert stamps.first_set is not None
        if i >= 2:
            phases.append(
                [
                    stamps.first_set - t0,
                    stamps.infer_start - stamps.first_set,
                    stamps.infer_end - stamps.infer_start,
                    t1 - stamps.infer_end,
                ]
            )
    return [statistics.median(p[k] for p in phases) * 1000 for k in range(4)]


SH = {"alone": alone(PAST), "9 rows9": drafted(PAST)}
for _ in range(3):
    cells = []
    for k, v in SH.items():
        feeds, bind, infer, logits = split(v)
        cells.append(f"{k}: feeds {feeds:.3f} set {bind:.3f} infer {infer:.2f} logits {logits:.3f}")
    print(" | ".join(cells), flush=True)
