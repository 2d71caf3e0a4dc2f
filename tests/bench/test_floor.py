"""The suffix-only prefill floor measured on a real engine (stories260K fp32, onnxruntime in-process)."""

from __future__ import annotations

from llmkiln.bench.floor import FloorMeter
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import BenchRequest

PROMPT = "Once upon a time there was a little girl who loved the sea. Every day she walked to the beach and"


def test_floor_times_the_suffix_after_the_reported_cached_tokens(engine_factory) -> None:
    engine = engine_factory("stories-fp32")
    req = BenchRequest(index=0, prompt=PROMPT, max_tokens=4, num_prompt_tokens=0, group="shared")
    meter = FloorMeter(engine, [req])
    try:
        n = len(meter.engine.encode(PROMPT))
        served = RequestRecord(index=0, group="shared", send_ns=0, token_ns=[5_000_000], end_ns=6_000_000)
        served.num_cached_tokens = 16
        meter.measure(served)
        meter.measure(served)  # the past is already in the slot: only the suffix runs again
        failed = RequestRecord(index=0, group="shared", send_ns=0, error="boom")
        meter.measure(failed)  # not counted
        result = meter.result()
    finally:
        meter.close()
    assert result.requests == 2
    assert result.cached_tokens.p50 == 16 and result.suffix_tokens.p50 == n - 16
    assert result.prefill_ms.p50 is not None and result.prefill_ms.p50 > 0
    assert result.ttft_ms.p50 == 5.0 and result.ratio_p50 == 5.0 / result.prefill_ms.p50
