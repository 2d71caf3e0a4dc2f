"""Custom Triton metrics published from the python backend with pb_utils.MetricFamily.

They appear on the metrics endpoint (default :8002/metrics) next to Triton's own nv_inference_* metrics:
  llmkiln_prompt_tokens_total             counter    prompt tokens submitted
  llmkiln_prefix_cache_hit_tokens_total   counter    prompt tokens served from the prefix KV cache
  llmkiln_prefix_cache_hit_rate           gauge      hit tokens / prompt tokens since start
  llmkiln_kv_blocks_used                  gauge      KV blocks in use (runtime block store)
  llmkiln_queue_length                    gauge      requests waiting in the runtime's queue
  llmkiln_ttft_ms                         histogram  arrival -> first token, per request
  llmkiln_requests_rejected_total         counter    requests refused (queue full, prompt too long, bad input)
  llmkiln_warmup_requests_total           counter    warmup requests run before READY
  llmkiln_warmup_seconds                  gauge      wall time of the warmup phase
  llmkiln_engine{metric="<name>"}         gauge      every LLMEngine.metrics() value (names: runtime.metrics.
                                                     EngineMetric), e.g. mean_queue_time_ms, mean_prefill_step_ms,
                                                     num_running, num_free_slots: what `kiln diagnose` reads
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmkiln.runtime.metrics import EngineMetric

TTFT_BUCKETS_MS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0]


class ServeMetrics:
    """The llmkiln metric families; `pb` is triton_python_backend_utils (or a stand-in in unit tests)."""

    def __init__(self, pb: Any, model_name: str, model_version: str = "1") -> None:
        labels = {"model": model_name, "version": model_version}
        mf = pb.MetricFamily

        def family(name: str, desc: str, kind: Any) -> Any:
            return mf(name=name, description=desc, kind=kind)

        self._families = [
            family("llmkiln_prompt_tokens_total", "Prompt tokens submitted", mf.COUNTER),
            family(
                "llmkiln_prefix_cache_hit_tokens_total",
                "Prompt tokens served from the prefix KV cache",
                mf.COUNTER,
            ),
            family(
                "llmkiln_prefix_cache_hit_rate",
                "Prefix-cache hit tokens / prompt tokens since start",
                mf.GAUGE,
            ),
            family("llmkiln_kv_blocks_used", "KV blocks in use in the runtime block store", mf.GAUGE),
            family("llmkiln_queue_length", "Requests waiting in the runtime queue", mf.GAUGE),
            family(
                "llmkiln_ttft_ms", "Time to first token (arrival to first token), milliseconds", mf.HISTOGRAM
            ),
            family(
                "llmkiln_requests_rejected_total",
                "Requests refused (queue full, prompt too long, bad input)",
                mf.COUNTER,
            ),
            family(
                "llmkiln_warmup_requests_total",
                "Warmup requests run before the model reported READY",
                mf.COUNTER,
            ),
            family("llmkiln_warmup_seconds", "Wall time of the warmup phase, seconds", mf.GAUGE),
        ]
        self._families.append(
            family("llmkiln_engine", "Runtime engine metrics (LLMEngine.metrics()), by name", mf.GAUGE)
        )
        (f_prompt, f_hit, f_rate, f_blocks, f_queue, f_ttft, f_rej, f_wreq, f_wsec, f_engine) = self._families
        self.prompt_tokens = f_prompt.Metric(labels=labels)
        self.hit_tokens = f_hit.Metric(labels=labels)
        self.hit_rate = f_rate.Metric(labels=labels)
        self.blocks_used = f_blocks.Metric(labels=labels)
        self.queue_length = f_queue.Metric(labels=labels)
        self.ttft_ms = f_ttft.Metric(labels=labels, buckets=TTFT_BUCKETS_MS)
        self.rejected = f_rej.Metric(labels=labels)
        self.warmup_requests = f_wreq.Metric(labels=labels)
        self.warmup_seconds = f_wsec.Metric(labels=labels)
        self.engine = {m: f_engine.Metric(labels={**labels, "metric": str(m)}) for m in EngineMetric}
        self._prompt = 0
        self._hit = 0

    def observe_request(self, prompt_tokens: int, cached_tokens: int, ttft_ms: float | None) -> None:
        """Record one finished request."""
        self._prompt += max(prompt_tokens, 0)
        self._hit += max(cached_tokens, 0)
        self.prompt_tokens.increment(max(prompt_tokens, 0))
        self.hit_tokens.increment(max(cached_tokens, 0))
        self.hit_rate.set(self._hit / self._prompt if self._prompt else 0.0)
        if ttft_ms is not None and ttft_ms >= 0:
            self.ttft_ms.observe(ttft_ms)

    def observe_engine(self, values: Mapping[str, float]) -> None:
        """Refresh the gauges from LLMEngine.metrics() (keys: llmkiln.runtime.metrics.EngineMetric)."""
        self.blocks_used.set(values[EngineMetric.KV_BLOCKS_USED])
        self.queue_length.set(values[EngineMetric.QUEUE_LENGTH])
        for name, metric in self.engine.items():
            if name in values:
                metric.set(values[name])

    def close(self) -> None:
        """Drop metrics before their families (the stub requires that order)."""
        for attr in (
            "prompt_tokens",
            "hit_tokens",
            "hit_rate",
            "blocks_used",
            "queue_length",
            "ttft_ms",
            "rejected",
            "warmup_requests",
            "warmup_seconds",
            "engine",
        ):
            if hasattr(self, attr):
                delattr(self, attr)
        self._families.clear()
