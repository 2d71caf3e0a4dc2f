"""The host's metrics (llmkiln.host.metrics: names, descriptions, kinds) published through Triton's custom
metrics API (pb_utils.MetricFamily), on the metrics endpoint (default :8002/metrics) next to Triton's own
nv_inference_* metrics, labelled with the model name and version. The Dynamo worker publishes the same names as
text (llmkiln.host.metrics.exposition)."""

from __future__ import annotations

from llmkiln.host.metrics import (
    ENGINE_DESCRIPTION,
    ENGINE_FAMILY,
    FAMILIES,
    TTFT_BUCKETS_MS,
    HostMetrics,
    Kind,
)
from llmkiln.runtime.metrics import EngineMetric
from llmkiln.serve.triton_pb import TritonMetric, TritonMetricFamily, TritonPb


class TritonMetrics:
    """pb_utils metric families mirroring a HostMetrics; `pb` is triton_python_backend_utils (or a stand-in)."""

    def __init__(self, pb: TritonPb, model_name: str, model_version: str = "1") -> None:
        labels = {"model": model_name, "version": model_version}
        mf = pb.MetricFamily
        kinds = {Kind.COUNTER: mf.COUNTER, Kind.GAUGE: mf.GAUGE, Kind.HISTOGRAM: mf.HISTOGRAM}
        self._families: list[TritonMetricFamily] = []
        self.metrics: dict[str, TritonMetric] = {}
        for attr, fam in FAMILIES.items():
            family = mf(name=fam.name, description=fam.description, kind=kinds[fam.kind])
            self._families.append(family)
            self.metrics[attr] = (
                family.Metric(labels=labels, buckets=list(TTFT_BUCKETS_MS))
                if fam.kind is Kind.HISTOGRAM
                else family.Metric(labels=labels)
            )
        engine = mf(name=ENGINE_FAMILY, description=ENGINE_DESCRIPTION, kind=mf.GAUGE)
        self._families.append(engine)
        self.engine = {m: engine.Metric(labels={**labels, "metric": str(m)}) for m in EngineMetric}
        self._published: dict[str, float] = {}  # the value last published (each call to the stub is an IPC)

    def publish(self, host: HostMetrics) -> None:
        """Bring the Triton metrics to the host's values; only what changed is sent (cheap after each request)."""
        values, _, engine = host.snapshot()
        for attr, fam in FAMILIES.items():
            metric = self.metrics.get(attr)
            if metric is None:
                continue
            if fam.kind is Kind.HISTOGRAM:
                for v in host.take_ttft():
                    metric.observe(v)
                continue
            last = self._published.get(attr)
            if last == values[attr]:
                continue
            if fam.kind is Kind.COUNTER:
                if values[attr] > (last or 0.0):
                    metric.increment(values[attr] - (last or 0.0))
            else:
                metric.set(values[attr])
            self._published[attr] = values[attr]
        for name, value in engine.items():
            key = f"engine:{name}"
            if self._published.get(key) != value:
                self.engine[name].set(value)
                self._published[key] = value

    def close(self) -> None:
        """Drop metrics before their families (the stub requires that order)."""
        self.metrics.clear()
        self.engine.clear()
        self._families.clear()
