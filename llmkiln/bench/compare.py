"""`kiln bench compare A.json B.json`: relative change B vs A per metric, statistic and concurrency level.

change = (B − A) / A; negative is better for latencies (TTFT, TPOT, ITL, e2e), positive is better for throughputs.
Levels are matched by concurrency; a level or statistic missing on either side is skipped.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from llmkiln.bench.report import BenchReport
from llmkiln.bench.stats import Dist, LevelStats

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_ttft_ms", "server_queue_ms")
STATS = ("mean", "p50", "p90", "p95", "p99")
THROUGHPUTS = ("request_throughput", "output_token_throughput")


class Change(BaseModel):
    """One compared number."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    metric: str  # e.g. ttft_ms, groups.short.ttft_ms, output_token_throughput
    stat: str  # mean/p50/... or "value" for throughputs
    a: float
    b: float
    change: float | None  # (b - a) / a, None when a == 0


def rel_change(a: float, b: float) -> float | None:
    """(b − a) / a, or None when a is zero."""
    return None if a == 0 else (b - a) / a


def _dist_changes(c: int, metric: str, da: Dist, db: Dist) -> list[Change]:
    out = []
    for s in STATS:
        va, vb = getattr(da, s), getattr(db, s)
        if va is not None and vb is not None:
            out.append(Change(concurrency=c, metric=metric, stat=s, a=va, b=vb, change=rel_change(va, vb)))
    return out


def compare_levels(la: LevelStats, lb: LevelStats) -> list[Change]:
    """Every latency statistic, group TTFT and throughput of two levels with the same concurrency."""
    c = la.concurrency
    out: list[Change] = []
    for m in LATENCIES:
        out += _dist_changes(c, m, getattr(la, m), getattr(lb, m))
    for g in sorted(set(la.groups) & set(lb.groups)):
        if len(la.groups) > 1:
            out += _dist_changes(c, f"groups.{g}.ttft_ms", la.groups[g].ttft_ms, lb.groups[g].ttft_ms)
    for m in THROUGHPUTS:
        va, vb = getattr(la, m), getattr(lb, m)
        out.append(Change(concurrency=c, metric=m, stat="value", a=va, b=vb, change=rel_change(va, vb)))
    return out


def compare(a: BenchReport, b: BenchReport) -> list[Change]:
    """Changes of B relative to A over the concurrency levels both reports have."""
    out: list[Change] = []
    for la in a.levels:
        lb = b.level(la.concurrency)
        if lb is not None:
            out += compare_levels(la, lb)
    return out


def find(changes: list[Change], concurrency: int, metric: str, stat: str) -> Change | None:
    return next(
        (x for x in changes if (x.concurrency, x.metric, x.stat) == (concurrency, metric, stat)), None
    )


def fmt_change(ch: float | None) -> str:
    return "n/a" if ch is None else f"{ch * 100:+.1f}%"


def compare_table(changes: list[Change], label_a: str, label_b: str, stats: tuple[str, ...] = STATS) -> Table:
    """A rich table: one row per (concurrency, metric, stat)."""
    table = Table(
        "conc", "metric", "stat", label_a, label_b, "change", box=None, title=f"{label_b} vs {label_a}"
    )
    for x in changes:
        if x.stat in stats or x.stat == "value":
            color = _color(x)
            table.add_row(
                str(x.concurrency),
                x.metric,
                x.stat,
                f"{x.a:.2f}",
                f"{x.b:.2f}",
                f"[{color}]{fmt_change(x.change)}[/]",
            )
    return table


def _color(x: Change) -> str:
    if x.change is None or abs(x.change) < 0.02:
        return "white"
    better = x.change < 0 if x.stat != "value" else x.change > 0
    return "green" if better else "red"


def compare_markdown(
    changes: list[Change], label_a: str, label_b: str, metrics: tuple[str, ...] | None = None
) -> str:
    """Markdown table of the changes (optionally only `metrics`)."""
    lines = [f"| conc | metric | stat | {label_a} | {label_b} | change |", "|---:|---|---|---:|---:|---:|"]
    for x in changes:
        if metrics is None or x.metric in metrics:
            lines.append(
                f"| {x.concurrency} | {x.metric} | {x.stat} | {x.a:.1f} | {x.b:.1f} | {fmt_change(x.change)} |"
            )
    return "\n".join(lines)
