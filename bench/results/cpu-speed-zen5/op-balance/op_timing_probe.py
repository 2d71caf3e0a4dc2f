"""One shape on the cascade graph, many times, for the op's own timer (README.md, the op table):

    PYTHONPATH=CHECKOUT LLMKILN_CASCADE_TIMING=1 python bench/results/cpu-speed-zen5/op-balance/op_timing_probe.py \
        engines/smollm2-ov-bf16 TURN_TOKENS DECODES RUNS

DECODES decodes on a shared 1504-token prefix (40 own tokens each), and a TURN_TOKENS-token turn on the prefix
(0: none). Prints the step median; the op prints its µs a layer per call when the process ends."""

import statistics
import sys
import time
from pathlib import Path

from step_probe import PREFIX, ids, runner_with_prefix


def main() -> None:
    engine, turn_tokens, decodes, runs = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    r, shared, turn = runner_with_prefix(engine, 33)
    plan = [(f"s{i}", (5 + i,), PREFIX + 40, shared[i]) for i in range(decodes)]
    if turn_tokens:
        plan.append(("t", ids(r, 400, turn_tokens), PREFIX, turn))
    for _ in range(3):
        r._run(plan, [1] * len(plan), cascade=True)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        r._run(plan, [1] * len(plan), cascade=True)
        ts.append((time.perf_counter() - t) * 1e3)
    print(f"{engine.name} turn {turn_tokens} + {decodes} decodes: step median {statistics.median(ts):.1f} ms")


if __name__ == "__main__":
    main()
