"""The host's metrics (llmkiln.host.metrics: names, descriptions, kinds) published through Triton's custom
metrics API (pb_utils.MetricFamily), on the metrics endpoint (default :8002/metrics) next to Triton's own
nv_inference_* metrics, labelled with the model name and version. The Dynamo worker publishes the same names as
text (llmkiln.host.metrics.exposition)."""

from __future__ import annotations

from llmkiln.host.metrics import (
    ENGINE_DESCRIPTION,
    ENGINE_FAMILY,
    FAMILIES,
    INFO_DESCRIPTIONS,
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
        self._pb, self._labels = pb, labels
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
        self.info: list[
            TritonMetric
        ] = []  # the CPU and the runtime settings: 1 each, set once (publish_info)
        self._published: dict[str, float] = {}  # the value last published (each call to the stub is an IPC)

    def publish_info(self, host: HostMetrics) -> None:
        """The info gauges (llmkiln_cpu_features, llmkiln_runtime_setting), once: they never change."""
        if self.info:
            return
        families: dict[str, TritonMetricFamily] = {}
        for name, labels in host.info_samples():
            if name not in families:
                families[name] = self._pb.MetricFamily(
                    name=name, description=INFO_DESCRIPTIONS[name], kind=self._pb.MetricFamily.GAUGE
                )
                self._families.append(families[name])
            metric = families[name].Metric(labels={**self._labels, **labels})
            metric.set(1.0)
            self.info.append(metric)

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
        self.info.clear()
        self._families.clear()
