"""The host's metrics: one set of names for every front door.

The Triton model publishes them through pb_utils.MetricFamily (llmkiln.serve.metrics), the Dynamo worker as
Prometheus text on its status port (`exposition`); `kiln diagnose` reads either (llmkiln.diagnose.from_metrics).

  llmkiln_prompt_tokens_total             counter    prompt tokens of requests that ended normally
  llmkiln_prefix_cache_hit_tokens_total   counter    of those, tokens served from the prefix KV cache
  llmkiln_prefix_cache_hit_rate           gauge      hit tokens / prompt tokens since start
  llmkiln_kv_blocks_used                  gauge      KV blocks holding a cached prefix (runtime block store)
  llmkiln_kv_blocks_pinned                gauge      KV blocks running sequences use
  llmkiln_kv_blocks_free                  gauge      KV blocks a new prefix may take
  llmkiln_active_slots                    gauge      sequences holding a KV slot in the runtime
  llmkiln_queue_length                    gauge      requests waiting in the runtime's queue
  llmkiln_requests_active                 gauge      requests the front door is serving now
  llmkiln_ttft_ms                         histogram  arrival -> first token, per successful request
  llmkiln_requests_succeeded_total        counter    requests that ended normally (stop, length, stop string)
  llmkiln_requests_rejected_total         counter    requests refused (bad input, too large, queue full, draining)
  llmkiln_requests_failed_total           counter    requests that started and ended in an error
  llmkiln_requests_cancelled_total        counter    requests the client cancelled
  llmkiln_warmup_requests_total           counter    warmup requests run before the host reported ready
  llmkiln_warmup_seconds                  gauge      wall time of the warmup
  llmkiln_engine_healthy                  gauge      1 while the engine's scheduler thread runs, 0 once it failed
  llmkiln_engine_stalled_seconds          gauge      seconds without an engine step while requests are in flight
  llmkiln_kv_transfer_registrations       gauge      NIXL memory registrations (prefill/decode hosts: the
                                                     prefix store's arrays, registered once; 0 after close)
  llmkiln_kv_transfer_exports_open        gauge      prefill: exports not released yet (0 when idle)
  llmkiln_kv_transfer_export_blocks       gauge      prefill: KV blocks those exports pin
  llmkiln_kv_transfer_exports_total       counter    prefill: exports handed out
  llmkiln_kv_transfer_exports_expired_total counter  prefill: exports released by timeout
  llmkiln_kv_transfer_pulls_active        gauge      decode: pulls in progress
  llmkiln_kv_transfer_imports_total       counter    decode: requests whose KV was pulled
  llmkiln_kv_transfer_import_blocks_total counter    decode: blocks read
  llmkiln_kv_transfer_import_bytes_total  counter    decode: bytes read
  llmkiln_kv_transfer_import_seconds_total counter   decode: seconds pulling (reserve + read)
  llmkiln_kv_transfer_import_read_seconds_total counter decode: of those, seconds in the NIXL read itself
  llmkiln_kv_transfer_fallbacks_total     counter    decode: prompts prefilled locally because the KV transfer failed
                                                     or no prefill worker was up (the tier's stand-in handed them back)
  llmkiln_kv_transfer_local_handoffs_total counter   prefill: short prompts handed to the decode worker at once
                                                     (uncached part <= --max-local-prefill-tokens; no KV moved)
  llmkiln_kv_transfer_local_prefills_total counter   decode: those prompts, prefilled here by choice (no fallback)
  llmkiln_kv_transfer_local_prefill_tokens_total counter decode: prompt tokens computed for them (not cached here)
  llmkiln_engine{metric="<name>"}         gauge      every LLMEngine.metrics() value (names: runtime.metrics.
                                                     EngineMetric), e.g. mean_queue_time_ms, num_running
  llmkiln_cpu_features{cpu_model,kind,amx,avx512_bf16,avx512,avx2,cores}  gauge  1: the CPU the engine runs on
                                                     (llmkiln.cpu_features; kind amx | avx512-bf16 | avx2 ...)
  llmkiln_runtime_setting{name,value}     gauge      1 per setting the runner runs with (Runner.runtime_settings:
                                                     precision, threads, OpenVINO's properties in force, ...)

Rejected, failed and cancelled requests are never counted as successes (nor in the TTFT histogram). With no
traffic, active slots and pinned blocks at 0 show that nothing leaked (`make soak` checks that).
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmkiln.cpu_features import SETTING_PREFIX
from llmkiln.runtime.metrics import EngineMetric

PREFIX = "llmkiln_"
ENGINE_FAMILY = "llmkiln_engine"
CPU_FAMILY = "llmkiln_cpu_features"
SETTING_FAMILY = "llmkiln_runtime_setting"
INFO_DESCRIPTIONS = {  # the info gauges (value 1): family -> help text
    CPU_FAMILY: "1: the CPU the engine runs on, its features as labels",
    SETTING_FAMILY: "1 per setting the engine's runner runs with (name, value)",
}
TTFT_BUCKETS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    kind: Kind


# HostMetrics attribute -> family (the order is the exposition's)
FAMILIES: dict[str, Family] = {
    "prompt_tokens": Family("llmkiln_prompt_tokens_total", "Prompt tokens submitted", Kind.COUNTER),
    "hit_tokens": Family(
        "llmkiln_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix KV cache", Kind.COUNTER
    ),
    "hit_rate": Family(
        "llmkiln_prefix_cache_hit_rate", "Prefix-cache hit tokens / prompt tokens since start", Kind.GAUGE
    ),
    "blocks_used": Family(
        "llmkiln_kv_blocks_used", "KV blocks holding a cached prefix (runtime block store)", Kind.GAUGE
    ),
    "blocks_pinned": Family("llmkiln_kv_blocks_pinned", "KV blocks running sequences use", Kind.GAUGE),
    "blocks_free": Family("llmkiln_kv_blocks_free", "KV blocks a new prefix may take", Kind.GAUGE),
    "active_slots": Family("llmkiln_active_slots", "Sequences holding a KV slot in the runtime", Kind.GAUGE),
    "queue_length": Family("llmkiln_queue_length", "Requests waiting in the runtime queue", Kind.GAUGE),
    "active": Family("llmkiln_requests_active", "Requests the model is serving now", Kind.GAUGE),
    "ttft_ms": Family(
        "llmkiln_ttft_ms", "Time to first token (arrival to first token), milliseconds", Kind.HISTOGRAM
    ),
    "succeeded": Family("llmkiln_requests_succeeded_total", "Requests that ended normally", Kind.COUNTER),
    "rejected": Family(
        "llmkiln_requests_rejected_total",
        "Requests refused (bad input, too large, queue full, shutting down)",
        Kind.COUNTER,
    ),
    "failed": Family(
        "llmkiln_requests_failed_total", "Requests that started and ended in an error", Kind.COUNTER
    ),
    "cancelled": Family("llmkiln_requests_cancelled_total", "Requests the client cancelled", Kind.COUNTER),
    "warmup_requests": Family(
        "llmkiln_warmup_requests_total", "Warmup requests run before the model reported READY", Kind.COUNTER
    ),
    "warmup_seconds": Family("llmkiln_warmup_seconds", "Wall time of the warmup phase, seconds", Kind.GAUGE),
    "engine_healthy": Family(
        "llmkiln_engine_healthy", "1 while the engine's scheduler thread runs, 0 once it failed", Kind.GAUGE
    ),
    "engine_stalled_seconds": Family(
        "llmkiln_engine_stalled_seconds",
        "Seconds without an engine step while requests are in flight (0 when idle)",
        Kind.GAUGE,
    ),
    # prefill/decode hosts (llmkiln.host.kv_transfer); 0 on an aggregated host
    "kv_registrations": Family(
        "llmkiln_kv_transfer_registrations",
        "NIXL memory registrations held (prefix-store arrays)",
        Kind.GAUGE,
    ),
    "kv_exports_open": Family(
        "llmkiln_kv_transfer_exports_open",
        "Prompt KV exports a decode worker has not released yet",
        Kind.GAUGE,
    ),
    "kv_export_blocks": Family(
        "llmkiln_kv_transfer_export_blocks", "KV blocks pinned by open exports", Kind.GAUGE
    ),
    "kv_exports": Family("llmkiln_kv_transfer_exports_total", "Prompt KV exports handed out", Kind.COUNTER),
    "kv_exports_expired": Family(
        "llmkiln_kv_transfer_exports_expired_total",
        "Exports released by timeout (the decode side never answered)",
        Kind.COUNTER,
    ),
    "kv_pulls_active": Family(
        "llmkiln_kv_transfer_pulls_active", "Pulls of prompt KV in progress on this decode worker", Kind.GAUGE
    ),
    "kv_imports": Family(
        "llmkiln_kv_transfer_imports_total",
        "Requests whose prompt KV was pulled from a prefill worker",
        Kind.COUNTER,
    ),
    "kv_import_blocks": Family(
        "llmkiln_kv_transfer_import_blocks_total", "KV blocks read from prefill workers", Kind.COUNTER
    ),
    "kv_import_bytes": Family(
        "llmkiln_kv_transfer_import_bytes_total", "Bytes of KV read from prefill workers", Kind.COUNTER
    ),
    "kv_import_seconds": Family(
        "llmkiln_kv_transfer_import_seconds_total", "Time spent pulling KV (reserve + read)", Kind.COUNTER
    ),
    "kv_import_read_seconds": Family(
        "llmkiln_kv_transfer_import_read_seconds_total", "Time spent in NIXL reads of KV", Kind.COUNTER
    ),
    "kv_fallbacks": Family(
        "llmkiln_kv_transfer_fallbacks_total",
        "Decode requests prefilled on the decode worker because their KV transfer failed or no prefill worker was up",
        Kind.COUNTER,
    ),
    "kv_local_handoffs": Family(
        "llmkiln_kv_transfer_local_handoffs_total",
        "Short prompts handed to the decode worker to prefill itself (uncached part <= the local limit)",
        Kind.COUNTER,
    ),
    "kv_local_prefills": Family(
        "llmkiln_kv_transfer_local_prefills_total",
        "Prompts prefilled on this decode worker because the prefill worker handed them back (not fallbacks)",
        Kind.COUNTER,
    ),
    "kv_local_prefill_tokens": Family(
        "llmkiln_kv_transfer_local_prefill_tokens_total",
        "Prompt tokens this decode worker computed for locally prefilled prompts (not served from its cache)",
        Kind.COUNTER,
    ),
}
ENGINE_DESCRIPTION = "Runtime engine metrics (LLMEngine.metrics()), by name"

# gauge attribute -> the LLMEngine.metrics() key it mirrors
ENGINE_GAUGES: dict[str, EngineMetric] = {
    "blocks_used": EngineMetric.KV_BLOCKS_USED,
    "blocks_pinned": EngineMetric.KV_BLOCKS_PINNED,
    "blocks_free": EngineMetric.KV_BLOCKS_FREE,
    "active_slots": EngineMetric.NUM_RUNNING,
    "queue_length": EngineMetric.QUEUE_LENGTH,
}


@dataclass
class Histogram:
    """Cumulative bucket counts (Prometheus `le` buckets) with sum and count."""

    bounds: tuple[float, ...] = TTFT_BUCKETS_MS
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +1 for +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1


class HostMetrics:
    """The values behind FAMILIES (plain numbers, thread-safe); front doors publish them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {
            attr: 0.0 for attr, f in FAMILIES.items() if f.kind is not Kind.HISTOGRAM
        }
        self.values["engine_healthy"] = 1.0
        self.ttft = Histogram()
        self.engine: dict[EngineMetric, float] = {}
        self._pending_ttft: list[float] = []  # observations a publisher has not taken yet (pb histograms)
        self.settings: dict[str, str] = {}  # the runner's runtime_settings (fixed once the engine is loaded)

    def info_samples(self) -> list[tuple[str, dict[str, str]]]:
        """(family, labels) of the info gauges (value 1): the CPU's features, then one per runtime setting."""
        # labels without the prefix, but the CPU's name as cpu_model ("model" is the Triton model's label)
        cpu = {
            (k if k == "cpu_model" else k.removeprefix(SETTING_PREFIX)): v
            for k, v in self.settings.items()
            if k.startswith(SETTING_PREFIX)
        }
        out = [(CPU_FAMILY, cpu)] if cpu else []
        out += [
            (SETTING_FAMILY, {"name": k, "value": v})
            for k, v in self.settings.items()
            if not k.startswith(SETTING_PREFIX)
        ]
        return out

    def add(self, attr: str, n: float = 1.0) -> None:
        with self._lock:
            self.values[attr] += n

    def set(self, attr: str, value: float) -> None:
        with self._lock:
            self.values[attr] = float(value)

    def observe_request(self, prompt_tokens: int, cached_tokens: int, ttft_ms: float | None) -> None:
        """Record one request that ended normally."""
        with self._lock:
            v = self.values
            v["succeeded"] += 1
            v["prompt_tokens"] += max(prompt_tokens, 0)
            v["hit_tokens"] += max(cached_tokens, 0)
            v["hit_rate"] = v["hit_tokens"] / v["prompt_tokens"] if v["prompt_tokens"] else 0.0
            if ttft_ms is not None and ttft_ms >= 0:
                self.ttft.observe(ttft_ms)
                self._pending_ttft.append(ttft_ms)

    def observe_engine(self, values: Mapping[str, float], healthy: bool, stalled_s: float = 0.0) -> None:
        """Refresh the engine gauges from LLMEngine.metrics() (keys: EngineMetric)."""
        with self._lock:
            for attr, key in ENGINE_GAUGES.items():
                if key in values:
                    self.values[attr] = float(values[key])
            self.engine = {m: float(values[m]) for m in EngineMetric if m in values}
            self.values["engine_healthy"] = 1.0 if healthy else 0.0
            self.values["engine_stalled_seconds"] = float(stalled_s)

    def take_ttft(self) -> list[float]:
        """TTFT observations since the last call (a publisher that can only observe one value at a time)."""
        with self._lock:
            out, self._pending_ttft = self._pending_ttft, []
        return out

    def snapshot(self) -> tuple[dict[str, float], Histogram, dict[EngineMetric, float]]:
        with self._lock:
            h = Histogram(self.ttft.bounds, list(self.ttft.counts), self.ttft.total, self.ttft.count)
            return dict(self.values), h, dict(self.engine)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def exposition(metrics: HostMetrics, labels: Mapping[str, str] | None = None) -> str:
    """Prometheus text exposition format (0.0.4) of the host's metrics, names as in the module docstring."""
    base = dict(labels or {})
    values, ttft, engine = metrics.snapshot()
    lines: list[str] = []
    for attr, fam in FAMILIES.items():
        lines.append(f"# HELP {fam.name} {fam.description}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        if fam.kind is Kind.HISTOGRAM:
            cum = 0
            for bound, n in zip((*ttft.bounds, float("inf")), ttft.counts, strict=True):
                cum += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"{fam.name}_bucket{_labels({**base, 'le': le})} {cum}")
            lines.append(f"{fam.name}_sum{_labels(base)} {ttft.total!r}")
            lines.append(f"{fam.name}_count{_labels(base)} {ttft.count}")
        else:
            lines.append(f"{fam.name}{_labels(base)} {values[attr]!r}")
    lines.append(f"# HELP {ENGINE_FAMILY} {ENGINE_DESCRIPTION}")
    lines.append(f"# TYPE {ENGINE_FAMILY} gauge")
    for m, value in engine.items():
        lines.append(f"{ENGINE_FAMILY}{_labels({**base, 'metric': str(m)})} {value!r}")
    described: set[str] = set()
    for family, labels in metrics.info_samples():
        if family not in described:
            described.add(family)
            lines.append(f"# HELP {family} {INFO_DESCRIPTIONS[family]}")
            lines.append(f"# TYPE {family} gauge")
        lines.append(f"{family}{_labels({**base, **labels})} 1")
    return "\n".join(lines) + "\n"


def parse_exposition(text: str) -> dict[str, float]:
    """The host's metrics read back from Prometheus text: `llmkiln_engine{metric="x"}` as "x" (EngineMetric
    names), every other llmkiln_* sample by its name without the prefix (the first sample of a name wins)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        name_part, _, value = line.rpartition(" ")
        name, _, rest = name_part.partition("{")
        try:
            number = float(value)
        except ValueError:
            continue
        if name == ENGINE_FAMILY:
            label = rest.split('metric="', 1)
            if len(label) == 2:
                out.setdefault(label[1].split('"', 1)[0], number)
            continue
        out.setdefault(name.strip()[len(PREFIX) :], number)
    return out
