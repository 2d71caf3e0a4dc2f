"""A benchmark run against a served model: optional warmup, then one closed-loop pass per concurrency level."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc.aio as grpcclient
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmkiln.bench.client import check_loopback, fetch_model_io, run_level, wait_ready
from llmkiln.bench.report import BenchReport, RunInfo, make_report
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.bench.workloads import Workload
from llmkiln.errors import BadInput


def parse_concurrency(text: str) -> list[int]:
    """'1,4,8,16' -> [1, 4, 8, 16]; BadInput on anything else."""
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(c <= 0 for c in levels) or len(set(levels)) != len(levels):
        raise BadInput(
            f"--concurrency {text!r}: give distinct positive integers separated by commas, e.g. 1,4,8,16"
        )
    return levels


@dataclass
class BenchConfig:
    """One `kiln bench` run."""

    url: str
    model: str
    workload: Workload  # warmup_requests + requests_per_level × len(concurrency) requests, in order
    concurrency: Sequence[int]
    requests_per_level: int
    warmup_requests: int = 0
    label: str = "llmkiln"
    timeout_s: float = 600.0
    ready_timeout_s: float = 30.0
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        check_loopback(self.url)
        if self.requests_per_level <= 0:
            raise BadInput(f"--requests must be positive, got {self.requests_per_level}")
        if self.warmup_requests < 0:
            raise BadInput(f"--warmup-requests must be zero or more, got {self.warmup_requests}")
        need = requests_needed(self.requests_per_level, self.concurrency, self.warmup_requests)
        if len(self.workload.requests) < need:
            raise BadInput(f"workload has {len(self.workload.requests)} requests, the run needs {need}")


def per_level(requests_per_level: int, concurrency: int) -> int:
    """Requests measured at one level: N, but at least the concurrency (else the level never reaches it)."""
    return max(requests_per_level, concurrency)


def requests_needed(requests_per_level: int, levels: Sequence[int], warmup: int) -> int:
    return warmup + sum(per_level(requests_per_level, c) for c in levels)


def level_slices(
    workload: Workload, levels: Sequence[int], requests_per_level: int, warmup: int
) -> dict[int, list]:
    """The disjoint request slices of each level, after the first `warmup` requests."""
    out, start = {}, warmup
    for c in levels:
        n = per_level(requests_per_level, c)
        out[c] = list(workload.requests[start : start + n])
        start += n
    return out


async def _run(cfg: BenchConfig) -> tuple[BenchReport, dict[int, list[RequestRecord]]]:
    client = grpcclient.InferenceServerClient(url=cfg.url)
    try:
        await wait_ready(client, cfg.model, cfg.ready_timeout_s)
        io = await fetch_model_io(client, cfg.model)
        reqs = cfg.workload.requests
        warm = reqs[: cfg.warmup_requests]
        slices = level_slices(cfg.workload, cfg.concurrency, cfg.requests_per_level, cfg.warmup_requests)
        total = len(warm) + sum(len(x) for x in slices.values())
        records: dict[int, list[RequestRecord]] = {}
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not cfg.progress,
            transient=False,
        ) as bar:
            task = bar.add_task(f"{cfg.label} warmup", total=total)

            def done(_: RequestRecord) -> None:
                bar.advance(task)

            if warm:
                await run_level(client, cfg.model, io, warm, max(cfg.concurrency), cfg.timeout_s, done)
            for c, chunk in slices.items():
                bar.update(task, description=f"{cfg.label} {cfg.workload.name} c={c}")
                records[c] = await run_level(client, cfg.model, io, chunk, c, cfg.timeout_s, done)
    finally:
        await client.close()
    levels = [level_stats(c, recs) for c, recs in records.items()]
    run = RunInfo(
        label=cfg.label,
        url=cfg.url,
        model=cfg.model,
        workload=cfg.workload.describe(),
        mode="warm" if cfg.warmup_requests else "cold",
        warmup_requests=cfg.warmup_requests,
        requests_per_level=cfg.requests_per_level,
        extra=dict(cfg.extra),
    )
    return make_report(run, levels, records), records


def run_bench(cfg: BenchConfig) -> tuple[BenchReport, dict[int, list[RequestRecord]]]:
    """Run the benchmark and return its report plus the raw per-request records (by concurrency)."""
    cfg.check()
    return asyncio.run(_run(cfg))
