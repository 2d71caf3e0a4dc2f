"""Is GenAI's 9-token step cheaper because of how it transforms the graph? OpenVINO GenAI's continuous batching runs
SDPAToPagedAttention with score aggregation allowed (`allow_score_aggregation = true`, pipeline_impl.cpp) and feeds a
score_aggregation_window input; llmkiln's runner calls paged_attention_transformation with every option off. Same
IR, both ways, one process each in turn (`--aggregation` sets the option and feeds zeros), steady runs of a lone
sequence on a 300-token past: its token alone, with 8 drafts (9 logits rows), with 8 padding tokens
(experiments.lone_sequence_runs).

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/genai_transform_probe.py engines/smollm2-ov-bf16 300 [--aggregation]
"""

import pathlib
import sys

import numpy as np
import openvino as ov

from experiments.lone_sequence_runs import REPS, alone, drafted, lone_runner, padded, steady
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import openvino_runner

AGGREGATION = "--aggregation" in sys.argv
if AGGREGATION:
    real_transform = openvino_runner.paged_attention_transformation

    def with_aggregation(model, *flags):
        real_transform(model, False, False, True, False, False, False)

    openvino_runner.paged_attention_transformation = with_aggregation


class Feeds:
    """The request, feeding score_aggregation_window (zeros, one per sequence) before each infer."""

    def __init__(self, req: ov.InferRequest) -> None:
        self._req, self._seqs = req, 1

    def set_tensor(self, name: str, tensor: ov.Tensor) -> None:
        if name == "past_lens":
            self._seqs = tensor.shape[0]
        self._req.set_tensor(name, tensor)

    def infer(self) -> None:
        self._req.set_tensor("score_aggregation_window", ov.Tensor(np.zeros(self._seqs, np.int32)))
        self._req.infer()

    def __getattr__(self, name: str):
        return getattr(self._req, name)


folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = int(sys.argv[2])
r = lone_runner(folder, PAST, wrap=Feeds if AGGREGATION else None)
SHAPES = {
    "token alone": alone(PAST),
    "token + 8 drafts (rows 9)": drafted(PAST),
    "token + 8 padding": padded(r, PAST),
}
print(
    f"{folder.path.name}, past {PAST}, score aggregation {'on' if AGGREGATION else 'off'}, medians of {REPS} (ms)"
)
for rnd in range(3):
    print(f"round {rnd + 1}: " + " | ".join(f"{k} {steady(r, v):.2f}" for k, v in SHAPES.items()), flush=True)
