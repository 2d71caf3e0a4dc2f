"""Step times of five shapes on the cascade graph under one checkout's code (README.md, "Steps"):

    PYTHONPATH=CHECKOUT python bench/results/cpu-speed-zen5/op-balance/step_probe.py engines/smollm2-ov-bf16

Decodes on a shared 1504-token prefix (40 own tokens each) and turns on that prefix; prints one JSON line: each
shape's median of 15 runs, ms."""

import json
import statistics
import sys
import time
from pathlib import Path

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

PREFIX = 1504


def runner_with_prefix(engine: Path, decoders: int):
    """A cascade runner with the prefix cached and `decoders` sequences of 40 own tokens on it; their tables,
    and a turn's table after the prefix."""
    folder = EngineDir(engine)
    r = OpenVinoPagedRunner(
        folder.openvino_model(), 48, 2048, None, 0, folder.recipe().precision, cascade=True
    )
    r.padding.limit = 0
    prefix = tuple(range(PREFIX // r.block_size))
    nxt = len(prefix)
    r._run([("p", ids(r, 1, PREFIX), 0, prefix)], [1], cascade=False)
    shared = []
    for i in range(decoders):
        shared.append(prefix + tuple(range(nxt, nxt + 3)))
        nxt += 3
        r._run([(f"s{i}", ids(r, 200 + i, 40), PREFIX, shared[i])], [1], cascade=False)
    return r, shared, prefix + tuple(range(nxt, nxt + 8))


def ids(r, start: int, n: int) -> tuple[int, ...]:
    return tuple((start + j) % r.vocab_size for j in range(n))


def main() -> None:
    r, shared, turn = runner_with_prefix(Path(sys.argv[1]), 33)

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
        for _ in range(3):
            r._run(plan, [1] * len(plan), cascade=True)
        ts = []
        for _ in range(15):
            t = time.perf_counter()
            r._run(plan, [1] * len(plan), cascade=True)
            ts.append((time.perf_counter() - t) * 1e3)
        out[name] = statistics.median(ts)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
