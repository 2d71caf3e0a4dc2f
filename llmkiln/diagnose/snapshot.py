"""Prometheus metrics: scrape an endpoint or read a saved snapshot (the text `curl .../metrics` prints), parsed
with prometheus_client's parser; sums over label sets and histogram quantiles the way Prometheus computes them."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmkiln.errors import BadInput


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets (upper bound, count), sum and count of one histogram (summed over label sets)."""

    buckets: list[tuple[float, float]]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q*count; the highest finite
        bound when the rank falls in +Inf."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
            lower, below = bound, cumulative
        return lower

    @property
    def max_bound(self) -> float | None:
        """Upper bound of the highest bucket that holds a sample (a ceiling on the slowest one)."""
        previous = 0.0
        top = None
        for bound, cumulative in self.buckets:
            if cumulative > previous:
                top = bound
            previous = cumulative
        return top


@dataclass
class MetricSnapshot:
    """Samples by name: (labels, value) pairs, from one or more expositions."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def add_text(self, text: str, source: str) -> None:
        try:
            families = list(text_string_to_metric_families(text))
        except (ValueError, TypeError) as exc:
            raise BadInput(f"{source}: not Prometheus text exposition format ({exc})") from None
        for fam in families:
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
                # the parser appends _total to counters (Triton's nv_inference_*_us have none): keep both names
                if fam.type == "counter" and s.name == f"{fam.name}_total":
                    self.samples.setdefault(fam.name, []).append((dict(s.labels), float(s.value)))
        self.sources.append(source)

    def total(self, name: str, **labels: str) -> float | None:
        """Sum over the label sets matching `labels` (None when the metric is absent)."""
        rows = [v for lab, v in self.samples.get(name, []) if _match(lab, labels)]
        return sum(rows) if rows else None

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """The histogram `name` (its _bucket/_sum/_count samples), summed over matching label sets."""
        by_bound: dict[float, float] = {}
        for lab, v in self.samples.get(f"{name}_bucket", []):
            if _match(lab, labels) and "le" in lab:
                bound = float(lab["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + v
        count = self.total(f"{name}_count", **labels)
        if not by_bound or count is None:
            return None
        return Histogram(sorted(by_bound.items()), self.total(f"{name}_sum", **labels) or 0.0, count)


def _match(labels: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def scrape(url: str, timeout_s: float = 10.0) -> str:
    """The exposition text at `url` (http or https)."""
    if not url.startswith(("http://", "https://")):
        raise BadInput(
            f"--metrics {url}: give an http(s) URL of a /metrics endpoint, e.g. http://127.0.0.1:8002/metrics"
        )
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise BadInput(
            f"--metrics {url}: cannot read it ({exc}); is the server up and the port right?"
        ) from None


def read_snapshot(path: Path) -> str:
    if not path.is_file():
        raise BadInput(
            f"{path}: no such file; save one with `curl -s http://HOST:PORT/metrics > {path.name}`"
        )
    return path.read_text(encoding="utf-8", errors="replace")
