"""Step times of five shapes on the cascade graph under one checkout's code (README.md, "Steps"):

    PYTHONPATH=CHECKOUT python bench/results/cpu-speed-zen5/op-balance/step_probe.py engines/smollm2-ov-bf16

Decodes on a shared 1504-token prefix (40 own tokens each) and turns on that prefix; prints one JSON line: each
shape's median of 15 runs, ms. Two settings for other compile choices on the same IR
(bench/results/openvino-int8-weights/README.md, end): OV_EXTRA (JSON: compile properties added to the runner's,
e.g. '{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 128}') and STEP_PRECISION (fp32 | bf16: compute and KV pools instead of
the recipe's precision)."""

import json
import os
import sys
from pathlib import Path

from experiments.shared_prefix_runs import PAST as PREFIX
from experiments.shared_prefix_runs import median_run_ms, prefix_with_decoders
from experiments.shared_prefix_runs import token_ids as ids


def main() -> None:
    r, shared, turn = prefix_with_decoders(
        Path(sys.argv[1]),
        33,
        40,
        precision=os.environ.get("STEP_PRECISION") or None,
        compile_extra=json.loads(os.environ.get("OV_EXTRA", "{}")),
    )

    def dec(k):
        return [(f"s{i}", (5 + i,), PREFIX + 40, shared[i]) for i in range(k)]

    shapes = {
        "8 decodes": dec(8),
        "32 decodes": dec(32),
        "7 dec + 35 turn": [*dec(7), ("t", ids(r, 400, 35), PREFIX, turn)],
        "7 dec + 100 turn": [*dec(7), ("t", ids(r, 400, 100), PREFIX, turn)],
        "31 dec + 100 turn": [*dec(31), ("t", ids(r, 400, 100), PREFIX, turn)],
    }
    out = {}
    for name, plan in shapes.items():
        out[name] = median_run_ms(r, plan)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
