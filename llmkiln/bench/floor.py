"""The physical floor of a shared-prefix request's TTFT: its uncached suffix prefilled on the cached past.

For every measured request of a level, the prompt is encoded as the server encodes it, the tokens the server
reported as served from the prefix cache are prefilled into one slot (not timed), and then the rest of the
prompt is prefilled on that past — batch 1, last-position logits only, the same ONNX graph and onnxruntime
settings as the served engine, in-process: no server, no scheduler, no queue, no sampling, no detokenization.
The best of `repeats` runs per request is its floor; a served TTFT within ~10% of it leaves nothing to gain
but the model's own arithmetic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llmkiln.bench.stats import Dist, RequestRecord, summarize
from llmkiln.bench.workloads import BenchRequest
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.scheduler import PrefillChunk, SchedulerOutput


class FloorResult(BaseModel):
    """Suffix-only prefill times of one level's requests (ms) and the token counts behind them."""

    model_config = ConfigDict(extra="forbid")

    requests: int
    prefill_ms: Dist
    suffix_tokens: Dist
    cached_tokens: Dist
    ttft_ms: Dist  # the served TTFT of the same requests (client clock)
    ratio_p50: float | None  # served TTFT p50 / floor p50


def suffix_prefill_floor(
    engine_dir: Path,
    requests: Sequence[BenchRequest],
    records: Sequence[RequestRecord],
    repeats: int = 2,
) -> FloorResult:
    """Floor of each successful record's request (matched by index); see the module docstring."""
    by_index = {r.index: r for r in requests}
    # One slot is enough; no prefix store (the cached part is prefilled directly into the slot).
    eng = load_engine(engine_dir, {"scheduler": {"max_batch_size": 1}, "kv_cache": {"prefix_reuse": False}})
    runner = eng.runner
    chunk = eng.config.scheduler.max_prefill_tokens
    times: list[float] = []
    suffixes: list[int] = []
    cached_list: list[int] = []
    in_slot: list[int] = []
    try:
        for rec in records:
            if not rec.ok or rec.index not in by_index:
                continue
            ids = eng.encode(by_index[rec.index].prompt)
            cached = min(rec.num_cached_tokens or 0, len(ids) - 1)
            if in_slot[:cached] != ids[:cached] or len(in_slot) < cached:
                for start in range(0, cached, chunk):  # the cached past, not timed
                    part = tuple(ids[start : min(start + chunk, cached)])
                    runner.execute(SchedulerOutput(prefills=[PrefillChunk("past", 0, start, part, False)]))
                in_slot = ids[:cached]
            suffix = tuple(ids[cached:])
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                runner.execute(SchedulerOutput(prefills=[PrefillChunk("floor", 0, cached, suffix, True)]))
                best = min(best, (time.perf_counter() - t0) * 1e3)
            times.append(best)
            suffixes.append(len(suffix))
            cached_list.append(cached)
    finally:
        eng.shutdown(0.1)
    floor = summarize(times)
    ttft = summarize(r.ttft_ms for r in records if r.ok)
    ratio = ttft.p50 / floor.p50 if ttft.p50 is not None and floor.p50 else None
    return FloorResult(
        requests=len(times),
        prefill_ms=floor,
        suffix_tokens=summarize(suffixes),
        cached_tokens=summarize(cached_list),
        ttft_ms=ttft,
        ratio_p50=ratio,
    )
