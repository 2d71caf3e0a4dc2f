"""Does setting fresh input tensors at every infer cost the OpenVINO runner? OpenVINO GenAI's ModelRunner keeps
one tensor per input and writes into it (`_get_or_resize_tensor`); llmkiln's runner wraps each run's numpy arrays
in new ov.Tensors. Same runs both ways (a lone sequence on a 300-token past: its token alone, with 8 drafts, with 8
padding), steady, medians of REPS, three rounds in turn.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/tensor_reuse_probe.py engines/smollm2-ov-bf16 300
"""

import pathlib
import statistics
import sys
import time

import openvino as ov

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
    "token alone": ([("s0", (5,), PAST, table)], [1]),
    "token + 8 drafts (rows 9)": ([("s0", tuple(range(5, 14)), PAST, table)], [9]),
    "token + 8 padding": ([("s0", (5,), PAST, table), pad], [1, 0]),
}


def timed(seqs, rows) -> float:
    ts = []
    for _ in range(REPS + 2):
        a = time.perf_counter()
        r._run(seqs, rows)
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts[2:])


class InPlace:
    """The runner's request, but set_tensor writes into the tensor already bound (GenAI's way)."""

    def __init__(self, req: ov.InferRequest) -> None:
        self._req = req

    def set_tensor(self, name: str, tensor: ov.Tensor) -> None:
        t = self._req.get_tensor(name)
        if tuple(t.shape) != tuple(tensor.shape):
            t.shape = tensor.shape
        t.data[...] = tensor.data

    def __getattr__(self, name: str):
        return getattr(self._req, name)


def run_reused(seqs, rows) -> float:
    real = r.req
    r.req = InPlace(real)  # type: ignore[assignment]
    try:
        return timed(seqs, rows)
    finally:
        r.req = real


print(
    f"{folder.path.name}, past {PAST}, medians of {REPS} steady runs (ms): fresh tensors / written in place"
)
for rnd in range(3):
    cells = []
    for k, v in SHAPES.items():
        cells.append(f"{k} {timed(*v):.2f} / {run_reused(*v):.2f}")
    print(f"round {rnd + 1}: " + " | ".join(cells), flush=True)
