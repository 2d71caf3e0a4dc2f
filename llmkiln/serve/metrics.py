"""Custom Triton metrics published from the python backend with pb_utils.MetricFamily.

They appear on the metrics endpoint (default :8002/metrics) next to Triton's own nv_inference_* metrics:
  llmkiln_prompt_tokens_total             counter    prompt tokens submitted
  llmkiln_prefix_cache_hit_tokens_total   counter    prompt tokens served from the prefix KV cache
  llmkiln_prefix_cache_hit_rate           gauge      hit tokens / prompt tokens since start
  llmkiln_kv_blocks_used                  gauge      KV blocks holding a cached prefix (runtime block store)
  llmkiln_kv_blocks_pinned                gauge      KV blocks running sequences use
  llmkiln_kv_blocks_free                  gauge      KV blocks a new prefix may take
  llmkiln_active_slots                    gauge      sequences holding a KV slot in the runtime
  llmkiln_queue_length                    gauge      requests waiting in the runtime's queue
  llmkiln_requests_active                 gauge      requests the model is serving now (set per request)
  llmkiln_ttft_ms                         histogram  arrival -> first token, per successful request
  llmkiln_requests_succeeded_total        counter    requests that ended normally (stop, length, stop string)
  llmkiln_requests_rejected_total         counter    requests refused (bad input, too large, queue full, draining)
  llmkiln_requests_failed_total           counter    requests that started and ended in an error
  llmkiln_requests_cancelled_total        counter    requests the client cancelled
  llmkiln_warmup_requests_total           counter    warmup requests run before READY
  llmkiln_warmup_seconds                  gauge      wall time of the warmup phase
  llmkiln_engine{metric="<name>"}         gauge      every LLMEngine.metrics() value (names: runtime.metrics.
                                                     EngineMetric), e.g. mean_queue_time_ms, mean_prefill_step_ms,
                                                     num_running, num_free_slots: what `kiln diagnose` reads
Rejected, failed and cancelled requests are never counted as successes (nor in the TTFT histogram). The engine
gauges are refreshed every second from LLMEngine.metrics(); with no traffic, active slots and pinned blocks at 0
show that nothing leaked (`make soak` checks that).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmkiln.runtime.metrics import EngineMetric
from llmkiln.serve.triton_pb import TritonMetric, TritonMetricFamily, TritonPb

TTFT_BUCKETS_MS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0]

# attribute -> (metric name, description, kind: counter | gauge | histogram)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "prompt_tokens": ("llmkiln_prompt_tokens_total", "Prompt tokens submitted", "counter"),
    "hit_tokens": (
        "llmkiln_prefix_cache_hit_tokens_total",
        "Prompt tokens served from the prefix KV cache",
        "counter",
    ),
    "hit_rate": (
        "llmkiln_prefix_cache_hit_rate",
        "Prefix-cache hit tokens / prompt tokens since start",
        "gauge",
    ),
    "blocks_used": (
        "llmkiln_kv_blocks_used",
        "KV blocks holding a cached prefix (runtime block store)",
        "gauge",
    ),
    "blocks_pinned": ("llmkiln_kv_blocks_pinned", "KV blocks running sequences use", "gauge"),
    "blocks_free": ("llmkiln_kv_blocks_free", "KV blocks a new prefix may take", "gauge"),
    "active_slots": ("llmkiln_active_slots", "Sequences holding a KV slot in the runtime", "gauge"),
    "queue_length": ("llmkiln_queue_length", "Requests waiting in the runtime queue", "gauge"),
    "active": ("llmkiln_requests_active", "Requests the model is serving now", "gauge"),
    "ttft_ms": (
        "llmkiln_ttft_ms",
        "Time to first token (arrival to first token), milliseconds",
        "histogram",
    ),
    "succeeded": ("llmkiln_requests_succeeded_total", "Requests that ended normally", "counter"),
    "rejected": (
        "llmkiln_requests_rejected_total",
        "Requests refused (bad input, too large, queue full, shutting down)",
        "counter",
    ),
    "failed": ("llmkiln_requests_failed_total", "Requests that started and ended in an error", "counter"),
    "cancelled": ("llmkiln_requests_cancelled_total", "Requests the client cancelled", "counter"),
    "warmup_requests": (
        "llmkiln_warmup_requests_total",
        "Warmup requests run before the model reported READY",
        "counter",
    ),
    "warmup_seconds": ("llmkiln_warmup_seconds", "Wall time of the warmup phase, seconds", "gauge"),
}

# engine gauge attribute -> the LLMEngine.metrics() key it mirrors
ENGINE_GAUGES: dict[str, EngineMetric] = {
    "blocks_used": EngineMetric.KV_BLOCKS_USED,
    "blocks_pinned": EngineMetric.KV_BLOCKS_PINNED,
    "blocks_free": EngineMetric.KV_BLOCKS_FREE,
    "active_slots": EngineMetric.NUM_RUNNING,
    "queue_length": EngineMetric.QUEUE_LENGTH,
}


class ServeMetrics:
    """The llmkiln metric families; `pb` is triton_python_backend_utils (or a stand-in in unit tests)."""

    def __init__(self, pb: TritonPb, model_name: str, model_version: str = "1") -> None:
        labels = {"model": model_name, "version": model_version}
        mf = pb.MetricFamily
        kinds = {"counter": mf.COUNTER, "gauge": mf.GAUGE, "histogram": mf.HISTOGRAM}
        self._families: list[TritonMetricFamily] = []
        self._attrs: list[str] = []
        for attr, (name, desc, kind) in FAMILIES.items():
            family = mf(name=name, description=desc, kind=kinds[kind])
            self._families.append(family)
            metric = (
                family.Metric(labels=labels, buckets=TTFT_BUCKETS_MS)
                if kind == "histogram"
                else family.Metric(labels=labels)
            )
            setattr(self, attr, metric)
            self._attrs.append(attr)
        engine = mf(name="llmkiln_engine", description="Runtime engine metrics (LLMEngine.metrics()), by name",
                    kind=mf.GAUGE)  # fmt: skip
        self._families.append(engine)
        self.engine = {m: engine.Metric(labels={**labels, "metric": str(m)}) for m in EngineMetric}
        self._attrs.append("engine")
        self._prompt = 0
        self._hit = 0

    def observe_request(self, prompt_tokens: int, cached_tokens: int, ttft_ms: float | None) -> None:
        """Record one request that ended normally."""
        self._prompt += max(prompt_tokens, 0)
        self._hit += max(cached_tokens, 0)
        self.succeeded.increment(1)
        self.prompt_tokens.increment(max(prompt_tokens, 0))
        self.hit_tokens.increment(max(cached_tokens, 0))
        self.hit_rate.set(self._hit / self._prompt if self._prompt else 0.0)
        if ttft_ms is not None and ttft_ms >= 0:
            self.ttft_ms.observe(ttft_ms)

    def observe_engine(self, values: Mapping[str, float]) -> None:
        """Refresh the engine gauges from LLMEngine.metrics() (keys: llmkiln.runtime.metrics.EngineMetric)."""
        for attr, key in ENGINE_GAUGES.items():
            getattr(self, attr).set(values[key])
        for name, metric in self.engine.items():
            if name in values:
                metric.set(values[name])

    def close(self) -> None:
        """Drop metrics before their families (the stub requires that order)."""
        for attr in self._attrs:
            if hasattr(self, attr):
                delattr(self, attr)
        self._families.clear()

    # typed views of the dynamically created metrics (mypy and readers see what exists)
    prompt_tokens: TritonMetric
    hit_tokens: TritonMetric
    hit_rate: TritonMetric
    blocks_used: TritonMetric
    blocks_pinned: TritonMetric
    blocks_free: TritonMetric
    active_slots: TritonMetric
    queue_length: TritonMetric
    active: TritonMetric
    ttft_ms: TritonMetric
    succeeded: TritonMetric
    rejected: TritonMetric
    failed: TritonMetric
    cancelled: TritonMetric
    warmup_requests: TritonMetric
    warmup_seconds: TritonMetric
    engine: dict[EngineMetric, TritonMetric]
