"""Does setting fresh input tensors at every infer cost the OpenVINO runner? OpenVINO GenAI's ModelRunner keeps
one tensor per input and writes into it (`_get_or_resize_tensor`); llmkiln's runner wraps each run's numpy arrays
in new ov.Tensors. Same runs both ways (a lone sequence on a 300-token past: its token alone, with 8 drafts, with 8
padding; experiments.lone_sequence_runs), steady, medians of REPS, three rounds in turn.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/tensor_reuse_probe.py engines/smollm2-ov-bf16 300
"""

import pathlib
import sys

import openvino as ov

from experiments.lone_sequence_runs import REPS, alone, drafted, lone_runner, padded, steady
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner


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


def steady_in_place(r: OpenVinoPagedRunner, run) -> float:
    real = r.req
    r.req = InPlace(real)  # type: ignore[assignment]
    try:
        return steady(r, run)
    finally:
        r.req = real


folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
r = lone_runner(folder, PAST)
SHAPES = {
    "token alone": alone(PAST),
    "token + 8 drafts (rows 9)": drafted(PAST),
    "token + 8 padding": padded(r, PAST),
}
print(
    f"{folder.path.name}, past {PAST}, medians of {REPS} steady runs (ms): fresh tensors / written in place"
)
for rnd in range(3):
    cells = [f"{k} {steady(r, v):.2f} / {steady_in_place(r, v):.2f}" for k, v in SHAPES.items()]
    print(f"round {rnd + 1}: " + " | ".join(cells), flush=True)
