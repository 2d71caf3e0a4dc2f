"""The runtime's metrics as Prometheus text on a Dynamo worker's status port (/metrics, next to Dynamo's own
dynamo_component_* series): one `llmkiln_<name>` gauge per llmkiln.runtime.metrics.EngineMetric, plus
`llmkiln_engine_healthy` and `llmkiln_warmup_seconds`. Tests and `kiln bench` read per-worker prefix-cache hits
from here; `parse_exposition` reads the text back."""

from __future__ import annotations

from collections.abc import Mapping

from llmkiln.runtime.metrics import EngineMetric

PREFIX = "llmkiln_"


def exposition(values: Mapping[str, float], healthy: bool, warmup_s: float) -> str:
    """Prometheus text exposition format (version 0.0.4) of the engine's metrics."""
    lines = []
    series = {f"{PREFIX}{m.value}": float(values[m]) for m in EngineMetric if m in values}
    series[f"{PREFIX}engine_healthy"] = 1.0 if healthy else 0.0
    series[f"{PREFIX}warmup_seconds"] = float(warmup_s)
    for name, value in series.items():
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def parse_exposition(text: str, prefix: str = PREFIX) -> dict[str, float]:
    """{name without prefix: value} of the unlabelled-or-labelled samples whose name starts with `prefix`
    (the first sample of a name wins)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            out.setdefault(name[len(prefix) :], float(value))
        except ValueError:
            continue
    return out
