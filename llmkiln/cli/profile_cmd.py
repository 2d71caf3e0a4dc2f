"""`kiln profile ENGINE`: where a served engine's time goes (runtime step profile + per-request TTFT hops)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llmkiln.bench.profile import markdown_profile
from llmkiln.bench.profiling import run_profile
from llmkiln.bench.report import markdown_report, print_report, save_report, write_atomic
from llmkiln.bench.runner import requests_needed
from llmkiln.bench.workloads import build_workload, load_tokenizer
from llmkiln.cli.options import (
    engines_dir_option,
    recipe_sets,
    sweep_levels,
    sweep_options,
    workload_options,
    workload_spec,
)
from llmkiln.engine_dir import resolve_engine


@click.command("profile")
@click.argument("engine", type=str)
@engines_dir_option
@workload_options
@sweep_options(concurrency="8", requests=32, warmup=2)
@click.option("--set", "sets", multiple=True, help="Recipe override SECTION.FIELD=VALUE (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="JSON report (with the profile).")
@click.option("--markdown", type=click.Path(dir_okay=False), default=None, help="Markdown tables.")
@click.option("--raw-profile", type=click.Path(dir_okay=False), default=None, help="Keep the raw JSONL.")
def profile(
    engine: str,
    engines_dir: Path,
    sets: tuple[str, ...],
    out: str | None,
    markdown: str | None,
    raw_profile: str | None,
    **kw: Any,
) -> None:
    """Serve ENGINE with the step profile on, run a workload, print where the time went.

    \b
    kiln profile engines/bench-optimized --concurrency 8 --requests 32 --markdown profile.md
    kiln profile engines/bench-optimized --set scheduler.tpot_slo_ms=50 --concurrency 4,8,16
    """
    folder = resolve_engine(engine, engines_dir).require()
    levels = sweep_levels(kw)
    requests_, warmup_requests = kw["requests_"], kw["warmup_requests"]
    spec = workload_spec(kw, requests_needed(requests_, levels, warmup_requests))
    wl = build_workload(load_tokenizer(folder.path), spec)
    report, _ = run_profile(
        folder.path,
        wl,
        levels,
        requests_,
        warmup_requests,
        overrides=recipe_sets(sets, "--set"),
        label=folder.path.name,
        keep=Path(raw_profile) if raw_profile else None,
    )
    print_report(report)
    text = markdown_report(report) + "\n" + "\n".join(markdown_profile(p) for p in report.profile.values())
    click.echo(text)
    if out:
        save_report(report, Path(out))
    if markdown:
        write_atomic(Path(markdown), text)
