"""PNG plots (matplotlib, Agg backend): TTFT CDF per concurrency level, and bars comparing runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
from matplotlib.figure import Figure

from llmkiln.bench.report import BenchReport


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def ttft_cdf(reports: Mapping[str, BenchReport], path: Path, title: str | None = None) -> Path:
    """One CDF line per (run, concurrency level) of per-request TTFT; runs differ by line style."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = ("-", "--", ":", "-.")
    cmap = plt.get_cmap("viridis")
    levels = sorted({int(c) for r in reports.values() for c in r.ttft_samples_ms})
    for i, (label, rep) in enumerate(reports.items()):
        for c_str, xs in sorted(rep.ttft_samples_ms.items(), key=lambda kv: int(kv[0])):
            if not xs:
                continue
            x = np.sort(np.asarray(xs))
            x = np.concatenate([x[:1], x])
            y = np.arange(0, len(xs) + 1) / len(xs)  # starts at 0 below the fastest request
            color = cmap(levels.index(int(c_str)) / max(1, len(levels) - 1) * 0.85)
            name = f"{label} c={c_str}" if len(reports) > 1 else f"c={c_str}"
            ax.step(x, y, where="post", linestyle=styles[i % len(styles)], color=color, label=name)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    first = next(iter(reports.values()), None)
    ax.set_title(title or (f"TTFT CDF: {first.run.workload.get('name')}" if first else "TTFT CDF"))
    return _save(fig, path)


def bars(
    reports: Mapping[str, BenchReport],
    path: Path,
    metric: str = "ttft_ms",
    stats: Sequence[str] = ("p50", "p95"),
    title: str | None = None,
) -> Path:
    """Grouped bars: x = concurrency level, one bar per (run, stat) of `metric` (a latency Dist or a throughput)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    levels = sorted({lv.concurrency for r in reports.values() for lv in r.levels})
    series = []
    for label, rep in reports.items():
        for s in stats:
            vals = []
            for c in levels:
                lv = rep.level(c)
                v = None
                if lv is not None:
                    obj = getattr(lv, metric)
                    v = obj if isinstance(obj, int | float) else getattr(obj, s)
                vals.append(np.nan if v is None else v)
            series.append((f"{label} {s}" if len(stats) > 1 else label, vals))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(levels))
    for i, (name, vals) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=name)
    ax.set_xticks(x, [f"c={c}" for c in levels])
    ax.set_ylabel(metric.replace("_ms", " (ms)").replace("_", " "))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title or metric)
    return _save(fig, path)
