"""Step times on the cascade graph with extra compile properties (OV_EXTRA, JSON), one run at a time: 8 and 32
decodes (40 own tokens each) on a shared 1504-token past, 7 of them + a 35- or 100-token turn; medians of 15 runs.

    OV_EXTRA='{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 128}' PYTHONPATH=. \\
        python bench/results/openvino-int8-weights/dq_group_probe.py engines/bench-ov-bf16-int8

Prints OV_EXTRA and each shape's median, ms (README.md, "bench-ov-bf16-int8 ... dynamic quantization")."""

import json
import os
import sys
from pathlib import Path

from experiments.shared_prefix_runs import PAST, median_run_ms, prefix_with_decoders, token_ids
from llmkiln.runtime.openvino_settings import OpenVinoSettings

EXTRA = json.loads(os.environ.get("OV_EXTRA", "{}"))
real_properties = OpenVinoSettings.properties


def with_extra(self: OpenVinoSettings) -> dict[str, object]:
    return {**real_properties(self), **EXTRA}


OpenVinoSettings.properties = with_extra  # type: ignore[method-assign]


def main() -> None:
    r, shared, turn = prefix_with_decoders(Path(sys.argv[1]), 33, 40)

    def dec(k):
        return [(f"s{i}", (5 + i,), PAST + 40, shared[i]) for i in range(k)]

    shapes = {
        "8d": dec(8),
        "32d": dec(32),
        "7d+35": [*dec(7), ("t", token_ids(r, 400, 35), PAST, turn)],
        "7d+100": [*dec(7), ("t", token_ids(r, 400, 100), PAST, turn)],
    }
    print(json.dumps(EXTRA), {k: round(median_run_ms(r, p), 2) for k, p in shapes.items()})


if __name__ == "__main__":
    main()
