"""The recipe's warmup, run by the engine host before its front door reports ready (every CPU front door:
Triton's model initialize, the Dynamo worker's start). The texts are `recipe.Warmup.texts()` — the same list
the TensorRT-LLM repository writers turn into model_warmup samples."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmkiln.errors import KilnError
from llmkiln.recipe import Warmup
from llmkiln.runtime.protocol import ServingEngine
from llmkiln.runtime.request import FinishReason, RequestRejected, SamplingParams

WARMUP_TIMEOUT_S = 600.0


class WarmupFailed(KilnError):
    """A warmup request was refused or failed: the host never reports ready."""


@dataclass(frozen=True)
class WarmupResult:
    requests: int
    seconds: float


def run_warmup(engine: ServingEngine, warmup: Warmup, timeout_s: float = WARMUP_TIMEOUT_S) -> WarmupResult:
    """Each text `count` times, one after the other (a prefix is in the store before the next text looks it up)."""
    t0 = time.perf_counter()
    params = SamplingParams(max_tokens=warmup.max_tokens)
    n = 0
    for i, text in enumerate(warmup.texts()):
        for _ in range(warmup.count):
            try:
                handle = engine.submit(text, params)
            except RequestRejected as exc:
                raise WarmupFailed(f"warmup text {i} ({text[:40]!r}...) was refused: {exc}") from None
            handle.result(timeout=timeout_s)
            if handle.finish_reason == FinishReason.ERROR.value:
                raise WarmupFailed(f"warmup text {i} ({text[:40]!r}...) failed: {handle.error}")
            n += 1
    return WarmupResult(n, time.perf_counter() - t0)
