"""A benchmark run against a served model: optional warmup, then one pass per concurrency level — a closed loop
(that many requests in flight), or with `request_rate` an open loop (Poisson arrivals, the level being the bound
on requests in flight) — over Triton's gRPC endpoint or an OpenAI-compatible one (chat or completions)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import tritonclient.grpc.aio as grpcclient
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from llmkiln.bench import client as triton_client
from llmkiln.bench import openai_client, spec_counters
from llmkiln.bench.arrivals import Send, closed_loop, open_loop
from llmkiln.bench.client import check_loopback, fetch_model_io
from llmkiln.bench.report import BenchReport, RunInfo, make_report
from llmkiln.bench.stats import RequestRecord, Slo, SpecStats, level_stats
from llmkiln.bench.workloads import BenchRequest, Workload
from llmkiln.errors import BadInput

Api = Literal["triton", "chat", "completions"]
APIS: tuple[str, ...] = ("triton", "chat", "completions")
DEFAULT_URLS = {
    "triton": "127.0.0.1:8001",
    "chat": "http://127.0.0.1:8000/v1",
    "completions": "http://127.0.0.1:8000/v1",
}


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
    api: Api = "triton"
    request_rate: float | None = None  # requests/s: open loop (Poisson); None: closed loop
    slo: Slo | None = None  # report goodput under this SLO
    seed: int = 0  # of the open loop's arrivals
    # called with (concurrency, record) as each measured request ends, before the loop sends the next one
    # (the experiment measures each c=1 request's prefill floor between requests)
    on_record: Callable[[int, RequestRecord], None] | None = None
    # the served model's /metrics (one per worker): its speculative-decoding counters around each level
    metrics_urls: Sequence[str] = ()

    def check(self) -> None:
        if self.api not in APIS:
            raise BadInput(f"--api {self.api!r}: choose one of {', '.join(APIS)}")
        if self.api == "triton":
            check_loopback(self.url)
        else:
            openai_client.check_openai_url(self.url)
        if self.request_rate is not None and not self.request_rate > 0:
            raise BadInput(f"--request-rate must be positive, got {self.request_rate}")
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


@contextlib.asynccontextmanager
async def _sender(cfg: BenchConfig) -> AsyncIterator[Send]:
    """A ready `send(request) -> RequestRecord` for the run's endpoint (closed when the run ends)."""
    if cfg.api == "triton":
        grpc = grpcclient.InferenceServerClient(url=cfg.url)
        try:
            await triton_client.wait_ready(grpc, cfg.model, cfg.ready_timeout_s)
            io = await fetch_model_io(grpc, cfg.model)

            async def send_triton(req: BenchRequest) -> RequestRecord:
                return await triton_client.run_one(grpc, cfg.model, io, req, cfg.timeout_s)

            yield send_triton
        finally:
            await grpc.close()
        return
    url = openai_client.check_openai_url(cfg.url)
    api: openai_client.Api = "chat" if cfg.api == "chat" else "completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.timeout_s) as http:
        await openai_client.wait_ready(http, url, cfg.model, cfg.ready_timeout_s)

        async def send_openai(req: BenchRequest) -> RequestRecord:
            return await openai_client.run_one(http, url, cfg.model, req, api, cfg.timeout_s)

        yield send_openai


async def _run(cfg: BenchConfig) -> tuple[BenchReport, dict[int, list[RequestRecord]]]:
    reqs = cfg.workload.requests
    warm = reqs[: cfg.warmup_requests]
    slices = level_slices(cfg.workload, cfg.concurrency, cfg.requests_per_level, cfg.warmup_requests)
    total = len(warm) + sum(len(x) for x in slices.values())
    records: dict[int, list[RequestRecord]] = {}
    spec: dict[int, SpecStats | None] = {}
    async with _sender(cfg) as send:
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

            def level_done(c: int) -> Callable[[RequestRecord], None]:
                def on_done(rec: RequestRecord) -> None:
                    done(rec)
                    if cfg.on_record is not None:
                        cfg.on_record(c, rec)

                return on_done

            if warm:
                await closed_loop(send, warm, max(cfg.concurrency), done)
            for c, chunk in slices.items():
                loop = f"rate={cfg.request_rate:g}/s max-in-flight={c}" if cfg.request_rate else f"c={c}"
                bar.update(task, description=f"{cfg.label} {cfg.workload.name} {loop}")
                before = (
                    await asyncio.to_thread(spec_counters.scrape, cfg.metrics_urls)
                    if cfg.metrics_urls
                    else {}
                )
                if cfg.request_rate:
                    records[c] = await open_loop(send, chunk, cfg.request_rate, cfg.seed, c, level_done(c))
                else:
                    records[c] = await closed_loop(send, chunk, c, level_done(c))
                if cfg.metrics_urls:
                    after = await asyncio.to_thread(spec_counters.scrape, cfg.metrics_urls)
                    spec[c] = spec_counters.level_delta(before, after)
    levels = [
        level_stats(c, recs, cfg.slo, cfg.request_rate).model_copy(update={"speculative": spec.get(c)})
        for c, recs in records.items()
    ]
    run = RunInfo(
        label=cfg.label,
        url=cfg.url,
        model=cfg.model,
        workload=cfg.workload.describe(),
        mode="warm" if cfg.warmup_requests else "cold",
        warmup_requests=cfg.warmup_requests,
        requests_per_level=cfg.requests_per_level,
        api=cfg.api,
        extra=dict(cfg.extra),
    )
    return make_report(run, levels, records), records


def run_bench(cfg: BenchConfig) -> tuple[BenchReport, dict[int, list[RequestRecord]]]:
    """Run the benchmark and return its report plus the raw per-request records (by concurrency)."""
    cfg.check()
    return asyncio.run(_run(cfg))
