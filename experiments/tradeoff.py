"""TTFT vs TPOT: the TTFT-first scheduler's trade-off, measured over `scheduler.tpot_slo_ms` settings (a part of
the TTFT experiment, experiments.ttft).

The same engine is served once per setting (decode-first, i.e. `ttft_first: false`, and TTFT-first with each
bound) and driven with fresh shared-prefix requests at a few concurrency levels: a looser bound lets prompts go
ahead of decodes more often (lower TTFT) and makes running requests wait longer for their next token (higher
TPOT). Every setting gets its own slice of the workload, so no request repeats one another setting saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llmkiln.bench.report import BenchReport
from llmkiln.bench.runner import BenchConfig, requests_needed, run_bench
from llmkiln.bench.serving import serve_engine
from llmkiln.bench.workloads import Workload

DECODE_FIRST = None  # the setting without TTFT-first scheduling


class TradeoffPoint(BaseModel):
    """One (setting, concurrency) measurement; times in ms."""

    model_config = ConfigDict(extra="forbid")

    setting: str
    ttft_first: bool
    tpot_slo_ms: float | None
    concurrency: int
    requests: int
    errors: int
    ttft_p50: float | None
    ttft_p95: float | None
    tpot_p50: float | None
    tpot_p95: float | None
    itl_p95: float | None
    output_tokens_per_s: float


def setting_name(slo: float | None) -> str:
    return "decode-first" if slo is None else f"ttft-first, tpot_slo_ms={slo:g}"


def run_tradeoff(
    engine_dir: Path,
    workload: Workload,
    slos: Sequence[float | None],
    levels: Sequence[int],
    per_level: int,
    warmup: int,
    timeout_s: float = 900.0,
) -> tuple[list[TradeoffPoint], dict[str, BenchReport]]:
    """Serve `engine_dir` once per setting (None = decode-first) and measure `levels` with fresh requests."""
    need = requests_needed(per_level, levels, warmup)
    if len(workload.requests) < need * len(slos):
        raise ValueError(
            f"the trade-off needs {need * len(slos)} requests, the workload has {len(workload.requests)}"
        )
    points: list[TradeoffPoint] = []
    reports: dict[str, BenchReport] = {}
    for i, slo in enumerate(slos):
        part = replace(workload, requests=workload.requests[i * need : (i + 1) * need])
        sched = {"ttft_first": False} if slo is None else {"ttft_first": True, "tpot_slo_ms": float(slo)}
        name = setting_name(slo)
        with serve_engine(engine_dir, overrides={"scheduler": sched}) as served:
            report, _ = run_bench(
                BenchConfig(
                    url=served.url,
                    model=served.model,
                    workload=part,
                    concurrency=levels,
                    requests_per_level=per_level,
                    warmup_requests=warmup,
                    label=name,
                    timeout_s=timeout_s,
                    extra={"engine_dir": str(engine_dir), "overrides": {"scheduler": sched}},
                )
            )
        reports[name] = report
        for lv in report.levels:
            points.append(
                TradeoffPoint(
                    setting=name,
                    ttft_first=slo is not None,
                    tpot_slo_ms=slo,
                    concurrency=lv.concurrency,
                    requests=lv.num_requests,
                    errors=lv.num_errors,
                    ttft_p50=lv.ttft_ms.p50,
                    ttft_p95=lv.ttft_ms.p95,
                    tpot_p50=lv.tpot_ms.p50,
                    tpot_p95=lv.tpot_ms.p95,
                    itl_p95=lv.itl_ms.p95,
                    output_tokens_per_s=lv.output_token_throughput,
                )
            )
    return points, reports


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def tradeoff_markdown(points: Sequence[TradeoffPoint]) -> list[str]:
    """One row per (setting, concurrency)."""
    md = [
        "| setting | conc | TTFT p50 | TTFT p95 | TPOT p50 | TPOT p95 | ITL p95 | out tok/s | ok/err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        md.append(
            f"| {p.setting} | {p.concurrency} | {_f(p.ttft_p50)} | {_f(p.ttft_p95)} | {_f(p.tpot_p50)} | "
            f"{_f(p.tpot_p95)} | {_f(p.itl_p95)} | {p.output_tokens_per_s:.1f} | {p.requests - p.errors}/{p.errors} |"
        )
    return md
