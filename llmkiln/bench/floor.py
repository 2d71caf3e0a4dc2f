"""The physical floor of a shared-prefix request's TTFT: its uncached suffix prefilled on the cached past.

For a served request, the prompt is encoded as the server encodes it, the tokens the server reported as served
from the prefix cache are prefilled into one slot (not timed), and then the rest of the prompt is prefilled on
that past — batch 1, last-position logits only, the same ONNX graph and onnxruntime settings as the served
engine, in-process: no server, no scheduler, no queue, no sampling, no detokenization. A served TTFT within ~10%
of it leaves nothing to gain but the model's own arithmetic.

The experiment measures it **between** the c=1 requests (`FloorMeter.measure` from the bench's per-record hook,
while the server is idle and before the next request is sent), so the floor and the TTFT it is compared with
see the same machine: on this shared 2-core host the speed of one and the same prefill drifts by tens of
percent over minutes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llmkiln.bench.stats import Dist, RequestRecord, summarize
from llmkiln.bench.workloads import BenchRequest
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.plan import PrefillChunk, Runner, SchedulerOutput


def fill_slot(runner: Runner, slot: int, token_ids: Sequence[int], chunk: int) -> None:
    """Prefill `token_ids` into `slot` from position 0 in chunks of at most `chunk` tokens (nothing sampled)."""
    for start in range(0, len(token_ids), chunk):
        part = tuple(token_ids[start : start + chunk])
        runner.execute(SchedulerOutput(prefills=[PrefillChunk(f"fill-{slot}", slot, start, part, False)]))


class FloorResult(BaseModel):
    """Suffix-only prefill times of one level's requests (ms) and the token counts behind them."""

    model_config = ConfigDict(extra="forbid")

    requests: int
    prefill_ms: Dist
    suffix_tokens: Dist
    cached_tokens: Dist
    ttft_ms: Dist  # the served TTFT of the same requests (client clock)
    ratio_p50: float | None  # served TTFT p50 / floor p50
    ratios: Dist  # per request: served TTFT / its floor


class FloorMeter:
    """An in-process copy of the engine (one slot, no prefix store) that times suffix-only prefills."""

    def __init__(self, engine_dir: Path, requests: Sequence[BenchRequest]) -> None:
        self.requests = {r.index: r for r in requests}
        self.engine: LLMEngine = load_engine(
            engine_dir, {"scheduler": {"max_batch_size": 1}, "kv_cache": {"prefix_reuse": False}}
        )
        self.chunk = self.engine.config.scheduler.max_prefill_tokens
        self._in_slot: list[int] = []
        self.times: list[float] = []
        self.suffixes: list[int] = []
        self.cached: list[int] = []
        self.records: list[RequestRecord] = []

    def measure(self, rec: RequestRecord) -> None:
        """Time the suffix-only prefill of a served request (one run, as the server runs it)."""
        if not rec.ok or rec.index not in self.requests:
            return
        runner = self.engine.runner
        ids = self.engine.encode(self.requests[rec.index].prompt)
        cached = min(rec.num_cached_tokens or 0, len(ids) - 1)
        if len(self._in_slot) < cached or self._in_slot[:cached] != ids[:cached]:
            fill_slot(runner, 0, ids[:cached], self.chunk)  # the cached past, not timed
            self._in_slot = ids[:cached]
        suffix = tuple(ids[cached:])
        t0 = time.perf_counter()
        runner.execute(SchedulerOutput(prefills=[PrefillChunk("floor", 0, cached, suffix, True)]))
        self.times.append((time.perf_counter() - t0) * 1e3)
        self.suffixes.append(len(suffix))
        self.cached.append(cached)
        self.records.append(rec)

    def result(self) -> FloorResult:
        floor = summarize(self.times)
        ttft = summarize(r.ttft_ms for r in self.records)
        ratio = ttft.p50 / floor.p50 if ttft.p50 is not None and floor.p50 else None
        per_request = [
            r.ttft_ms / t
            for r, t in zip(self.records, self.times, strict=True)
            if r.ttft_ms is not None and t
        ]
        return FloorResult(
            requests=len(self.times),
            prefill_ms=floor,
            suffix_tokens=summarize(self.suffixes),
            cached_tokens=summarize(self.cached),
            ttft_ms=ttft,
            ratio_p50=ratio,
            ratios=summarize(per_request),
        )

    def close(self) -> None:
        self.engine.shutdown(0.1)
