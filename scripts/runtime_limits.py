"""What bounds an engine on this host, measured in-process: memory bandwidth, one decode step at batch 1/2/4/8
with a long context, and one 100-token prefill on a 1500-token past (the shared-prefix request's own work).

    .venv/bin/python scripts/runtime_limits.py engines/bench-optimized [--context 1600]

From these, the closed-loop ceiling at concurrency c (each request: one suffix prefill, then `out - 1` decode
tokens in full batches of c) is  c * out / (c * prefill + (out - 1) * decode_c)  output tokens/s. docs/runtime.md
("What limits further gains") quotes a run.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from llmkiln.bench.floor import fill_slot
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.plan import DecodeItem, PrefillChunk, SchedulerOutput


def bandwidth_gbps() -> float:
    a = np.ones(256 * 1024 * 1024 // 8)  # 256 MiB, one pass
    best = min(_timed(a.sum) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine")
    ap.add_argument("--context", type=int, default=1600)
    ap.add_argument("--output-tokens", type=int, default=32)
    args = ap.parse_args()
    eng = load_engine(args.engine, {"scheduler": {"max_batch_size": 8}, "kv_cache": {"prefix_reuse": False}})
    runner, ctx, chunk = eng.runner, args.context, eng.config.scheduler.max_prefill_tokens
    rng = np.random.default_rng(0)
    try:
        for s in range(8):  # eight slots holding `ctx` tokens each
            fill_slot(runner, s, rng.integers(10, 30000, ctx).tolist(), chunk)
        res: dict[str, float] = {"memory_bandwidth_gbps (numpy sum, 1 thread)": round(bandwidth_gbps(), 1)}
        decode: dict[int, float] = {}
        for b in (1, 2, 4, 8):
            ts = []
            for k in range(12):
                plan = SchedulerOutput(decodes=[DecodeItem(f"r{s}", s, 100, ctx + k) for s in range(b)])
                ts.append(_timed(lambda plan=plan: runner.execute(plan)) * 1e3)
            decode[b] = float(np.median(ts[2:]))
            res[f"decode step, batch {b}, context {ctx} (ms p50)"] = round(decode[b], 1)
        ts = []
        for _ in range(6):
            suffix = tuple(rng.integers(10, 30000, 100).tolist())
            plan = SchedulerOutput(prefills=[PrefillChunk("r0", 0, ctx - 100, suffix, True)])
            ts.append(_timed(lambda plan=plan: runner.execute(plan)) * 1e3)
        prefill = float(np.median(ts[1:]))
        res[f"prefill, 100 tokens on a {ctx - 100}-token past (ms p50)"] = round(prefill, 1)
        out = args.output_tokens
        for c in (1, 4, 8):
            ceiling = c * out / (c * prefill + (out - 1) * decode[c]) * 1e3
            res[f"closed-loop ceiling, c={c}, {out} output tokens (tok/s)"] = round(ceiling, 1)
        print(json.dumps(res, indent=2))
    finally:
        eng.shutdown(0.1)


if __name__ == "__main__":
    main()
