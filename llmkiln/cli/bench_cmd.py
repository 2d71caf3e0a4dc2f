"""`kiln bench` (run a benchmark; `kiln bench run` is the same), `kiln bench compare`, `kiln bench soak`.

The project's experiments (`make bench-ttft`, `make bench-scaleout`) are not commands of the package: they live in
experiments/ beside their results and drive the same library (docs/bench.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from llmkiln.bench.compare import STATS, compare, compare_markdown, compare_table
from llmkiln.bench.plots import bars, ttft_cdf
from llmkiln.bench.report import (
    load_report,
    markdown_report,
    print_report,
    save_records,
    save_report,
    write_atomic,
)
from llmkiln.bench.runner import (
    APIS,
    DEFAULT_URLS,
    BenchConfig,
    requests_needed,
    run_bench,
)
from llmkiln.bench.soak import report_json, run_soak
from llmkiln.bench.stats import Slo
from llmkiln.bench.workloads import build_workload, load_tokenizer
from llmkiln.cli.options import (
    engines_dir_option,
    sweep_levels,
    sweep_options,
    workload_options,
    workload_spec,
)
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput

_Command = TypeVar("_Command", bound=Callable[..., Any])


def _run_options(f: _Command) -> _Command:
    opts = [
        click.option(
            "--api",
            type=click.Choice(APIS),
            default="triton",
            show_default=True,
            help="triton: gRPC (tensorrtllm_backend I/O); chat / completions: an OpenAI endpoint (kiln serve --dynamo).",
        ),
        click.option(
            "--url",
            default=None,
            help="Loopback only. triton: HOST:PORT (default 127.0.0.1:8001); OpenAI: base URL "
            "(default http://127.0.0.1:8000/v1).",
        ),
        click.option("--model", default="llmkiln", show_default=True, help="Served model name."),
        workload_options,
        click.option(
            "--tokenizer",
            type=str,
            default=None,
            help="Engine folder or tokenizer.json (exact token lengths).",
        ),
        sweep_options(concurrency="1,4,8,16", requests=16, warmup=0),
        click.option(
            "--request-rate",
            type=float,
            default=None,
            help="Open loop: Poisson arrivals at R requests/s (each --concurrency level bounds requests in flight).",
        ),
        click.option(
            "--slo-ttft-ms", type=float, default=None, help="Report goodput: requests with TTFT <= this ..."
        ),
        click.option(
            "--slo-tpot-ms", type=float, default=None, help="... and TPOT <= this (default 100 ms)."
        ),
        click.option(
            "--label", default="llmkiln", show_default=True, help="Name of this run in reports and plots."
        ),
        click.option(
            "--timeout", type=float, default=600.0, show_default=True, help="Per-request timeout (s)."
        ),
        click.option(
            "--out", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here."
        ),
        click.option(
            "--markdown", type=click.Path(dir_okay=False), default=None, help="Write a Markdown table here."
        ),
        click.option(
            "--plot", type=click.Path(dir_okay=False), default=None, help="Write the TTFT CDF PNG here."
        ),
        click.option(
            "--raw-out", type=click.Path(dir_okay=False), default=None, help="Per-request JSONL dump."
        ),
        click.option(
            "--metrics",
            "metrics_urls",
            multiple=True,
            help="The served model's /metrics URL (repeatable: one per worker): the report's speculative-"
            "decoding columns (drafted, acceptance, mean accepted length per level).",
        ),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _do_run(**kw: Any) -> None:
    levels = sweep_levels(kw)
    spec = workload_spec(kw, requests_needed(kw["requests_"], levels, kw["warmup_requests"]))
    tok = load_tokenizer(kw["tokenizer"]) if kw["tokenizer"] else None
    workload = build_workload(tok, spec)
    slo = None
    if kw["slo_ttft_ms"] is not None or kw["slo_tpot_ms"] is not None:
        slo = Slo(
            ttft_ms=1000.0 if kw["slo_ttft_ms"] is None else kw["slo_ttft_ms"],
            tpot_ms=100.0 if kw["slo_tpot_ms"] is None else kw["slo_tpot_ms"],
        )
    cfg = BenchConfig(
        url=kw["url"] or DEFAULT_URLS[kw["api"]],
        api=kw["api"],
        request_rate=kw["request_rate"],
        slo=slo,
        seed=kw["seed"],
        model=kw["model"],
        workload=workload,
        concurrency=levels,
        requests_per_level=kw["requests_"],
        warmup_requests=kw["warmup_requests"],
        label=kw["label"],
        timeout_s=kw["timeout"],
        progress=not kw["no_progress"],
        metrics_urls=tuple(kw["metrics_urls"]),
    )
    report, records = run_bench(cfg)
    print_report(report)
    if kw["out"]:
        save_report(report, Path(kw["out"]))
        click.echo(f"report: {kw['out']}")
    if kw["markdown"]:
        write_atomic(Path(kw["markdown"]), markdown_report(report))
    if kw["plot"]:
        ttft_cdf({report.run.label: report}, Path(kw["plot"]))
    if kw["raw_out"]:
        save_records(records, Path(kw["raw_out"]))
    if any(lv.num_errors for lv in report.levels):
        raise click.ClickException(
            f"{sum(lv.num_errors for lv in report.levels)} request(s) failed (see above)"
        )


@click.group(invoke_without_command=True)
@_run_options
@click.pass_context
def bench(ctx: click.Context, /, **kw: Any) -> None:
    """Benchmark a served model: TTFT/TPOT/ITL percentiles over a concurrency sweep.

    \b
    kiln bench --url 127.0.0.1:8001 --model llmkiln --tokenizer engines/NAME \\
        --workload shared-prefix --concurrency 1,4,8,16 --requests 16 --warmup-requests 2 --out report.json
    kiln bench --api chat --url http://127.0.0.1:8000/v1 --tokenizer engines/NAME --system-prompts 4 \\
        --concurrency 8 --request-rate 2 --slo-ttft-ms 1000 --slo-tpot-ms 100
    kiln bench compare A.json B.json
    kiln bench soak ENGINE --minutes 5
    """
    if ctx.invoked_subcommand is None:
        _do_run(**kw)


@bench.command("run")
@_run_options
def run_cmd(**kw: Any) -> None:
    """Same as `kiln bench` with options."""
    _do_run(**kw)


@bench.command("compare")
@click.argument("a", type=str)
@click.argument("b", type=str)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the changes as JSON.")
@click.option("--markdown", type=click.Path(dir_okay=False), default=None, help="Write a Markdown table.")
@click.option("--all-stats", is_flag=True, help="Show p90/p99 too (default: mean, p50, p95).")
@click.option(
    "--plot", type=click.Path(dir_okay=False), default=None, help="PNG: TTFT p50/p95 bars of both runs."
)
@click.option("--cdf", type=click.Path(dir_okay=False), default=None, help="PNG: TTFT CDFs of both runs.")
def compare_cmd(
    a: str, b: str, out: str | None, markdown: str | None, all_stats: bool, plot: str | None, cdf: str | None
) -> None:
    """Relative change of report B vs report A per metric, statistic and concurrency level."""

    ra, rb = load_report(a), load_report(b)
    changes = compare(ra, rb)
    if not changes:
        raise BadInput(f"{a} and {b} share no concurrency level; nothing to compare")
    la, lb = ra.run.label, rb.run.label
    if la == lb:
        la, lb = f"A:{la}", f"B:{lb}"
    stats = STATS if all_stats else ("mean", "p50", "p95")
    Console().print(compare_table(changes, la, lb, stats))
    if out:
        write_atomic(Path(out), json.dumps([c.model_dump() for c in changes], indent=2) + "\n")
    if markdown:
        write_atomic(Path(markdown), compare_markdown(changes, la, lb) + "\n")
    if plot or cdf:
        if plot:
            bars({la: ra, lb: rb}, Path(plot), "ttft_ms", ("p50", "p95"), f"TTFT: {lb} vs {la}")
        if cdf:
            ttft_cdf({la: ra, lb: rb}, Path(cdf))


@bench.command("soak")
@click.argument("engine")
@engines_dir_option
@click.option("--minutes", type=click.FloatRange(0.05, 24 * 60), default=5, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON.")
def soak_cmd(
    engine: str, engines_dir: Path, minutes: float, concurrency: int, max_tokens: int, out: str | None
) -> None:
    """Serve ENGINE and keep CONCURRENCY streams busy for MINUTES; report errors, p99 and RSS drift, leaks.

    Exit 1 when a request failed or slots/blocks are still held with no traffic (not run in CI)."""
    folder = resolve_engine(engine, engines_dir).require()
    report = run_soak(folder.path, minutes, concurrency, max_tokens)
    click.echo(report.text())
    if out:
        write_atomic(Path(out), report_json(report))
    if not report.ok:
        raise click.ClickException("the soak found errors or leaks (see above)")
