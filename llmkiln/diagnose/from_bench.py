"""Signals from a `kiln bench` report (llmkiln.bench.report, schema llmkiln.bench/1): client-side TTFT
percentiles, the server's queue and TTFT from its perf fields, cached tokens, throughput per level."""

from __future__ import annotations

import statistics

from llmkiln.bench.report import BenchReport
from llmkiln.diagnose.signals import Figure, Signals
from llmkiln.recipe import Recipe


def signals_from_bench(report: BenchReport, recipe: Recipe | None = None) -> Signals:
    """Figures of the report's highest concurrency level (the most loaded), plus the first request of the run
    and the throughput across levels."""
    sig = Signals()
    if not report.levels:
        return sig
    levels = sorted(report.levels, key=lambda lv: lv.concurrency)
    lv = levels[-1]
    at = f"level c={lv.concurrency}"
    for attr, stat in (
        ("ttft_p50_ms", "p50"),
        ("ttft_p95_ms", "p95"),
        ("ttft_p99_ms", "p99"),
        ("ttft_mean_ms", "mean"),
        ("ttft_max_ms", "max"),
    ):
        v = getattr(lv.ttft_ms, stat)
        if v is not None:
            setattr(sig, attr, Figure(v, f"bench report {at}: ttft_ms.{stat} (client)"))
    if lv.server_queue_ms.count and lv.server_queue_ms.mean is not None:
        sig.queue_ms = Figure(lv.server_queue_ms.mean, f"bench report {at}: server_queue_ms.mean")
        if lv.server_ttft_ms.mean is not None:  # compare the server's queue with the server's own TTFT
            sig.ttft_mean_ms = Figure(lv.server_ttft_ms.mean, f"bench report {at}: server_ttft_ms.mean")
    if lv.tpot_ms.p50 is not None:
        sig.tpot_p50_ms = Figure(lv.tpot_ms.p50, f"bench report {at}: tpot_ms.p50")
    if lv.itl_ms.p95 is not None:
        sig.itl_p95_ms = Figure(lv.itl_ms.p95, f"bench report {at}: itl_ms.p95")
    if lv.prompt_tokens_mean:
        sig.prompt_tokens_mean = Figure(lv.prompt_tokens_mean, f"bench report {at}: prompt_tokens_mean")
        if lv.cached_tokens_mean is not None:
            sig.hit_rate = Figure(
                min(1.0, lv.cached_tokens_mean / lv.prompt_tokens_mean),
                f"bench report {at}: cached_tokens_mean / prompt_tokens_mean",
            )
    spec = [x.speculative for x in levels if x.speculative is not None]
    drafted = sum(x.drafted_tokens for x in spec)
    if drafted:
        sig.set_speculation(
            drafted,
            sum(x.accepted_tokens for x in spec),
            sum(x.free_drafted_tokens for x in spec),
            sum(x.free_accepted_tokens for x in spec),
            "bench report, sum over levels: speculative.",
        )
    sig.requests = Figure(sum(x.num_requests for x in levels), "bench report: requests over all levels")
    rejected = sum(
        x.num_errors for x in levels if any("queue full" in e or "rejected" in e for e in x.errors)
    )
    sig.rejected = Figure(rejected, "bench report: failed requests whose error says queue full / rejected")
    if recipe is not None:
        slots = recipe.scheduler.max_batch_size
        sig.max_batch_size = Figure(slots, "recipe scheduler.max_batch_size")
        sig.utilization = Figure(
            min(1.0, lv.concurrency / slots),
            f"concurrency {lv.concurrency} / scheduler.max_batch_size (offered load)",
        )
    first = levels[0]
    samples = report.ttft_samples_ms.get(str(first.concurrency), [])
    if report.run.mode == "cold" and len(samples) >= 3:
        sig.first_ttft_ms = Figure(
            samples[0], f"bench report: first request of level c={first.concurrency} (cold run)"
        )
        sig.notes.append(f"median TTFT of the rest of that level: {statistics.median(samples[1:]):.1f} ms")
    best = max(levels, key=lambda x: x.output_token_throughput)
    if len(levels) > 1 and best.output_token_throughput > 0:
        drop = 1 - lv.output_token_throughput / best.output_token_throughput
        sig.throughput_drop = Figure(
            max(0.0, drop),
            f"1 - out tok/s at c={lv.concurrency} ({lv.output_token_throughput:.1f}) / best "
            f"(c={best.concurrency}: {best.output_token_throughput:.1f})",
        )
    return sig
