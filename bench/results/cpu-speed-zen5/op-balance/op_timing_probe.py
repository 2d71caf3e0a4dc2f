"""One shape on the cascade graph, many times, for the op's own timer (README.md, the op table):

    PYTHONPATH=CHECKOUT LLMKILN_CASCADE_TIMING=1 python bench/results/cpu-speed-zen5/op-balance/op_timing_probe.py \
        engines/smollm2-ov-bf16 TURN_TOKENS DECODES RUNS

DECODES decodes on a shared 1504-token prefix (40 own tokens each), and a TURN_TOKENS-token turn on the prefix
(0: none). Prints the step median; the op prints its µs a layer per call when the process ends. (The runs of
README.md's table were taken with the set-up step_probe.py had then; it now lives in
experiments.shared_prefix_runs, the same code.)"""

import sys
from pathlib import Path

from experiments.shared_prefix_runs import PAST as PREFIX
from experiments.shared_prefix_runs import median_run_ms, prefix_with_decoders
from experiments.shared_prefix_runs import token_ids as ids


def main() -> None:
    engine, turn_tokens, decodes, runs = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    r, shared, turn = prefix_with_decoders(engine, 33, 40)
    plan = [(f"s{i}", (5 + i,), PREFIX + 40, shared[i]) for i in range(decodes)]
    if turn_tokens:
        plan.append(("t", ids(r, 400, turn_tokens), PREFIX, turn))
    print(
        f"{engine.name} turn {turn_tokens} + {decodes} decodes: step median {median_run_ms(r, plan, runs):.1f} ms"
    )


if __name__ == "__main__":
    main()
