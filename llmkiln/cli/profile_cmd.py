"""`kiln profile ENGINE`: where a served engine's time goes (runtime step profile + per-request TTFT hops)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llmkiln.bench.profile import markdown_profile
from llmkiln.bench.profiling import run_profile
from llmkiln.bench.report import markdown_report, print_report, save_report, write_atomic
from llmkiln.bench.runner import parse_concurrency, requests_needed
from llmkiln.bench.workloads import WorkloadSpec, build_workload, load_tokenizer, parse_range
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.jsonl import loads_json


def _overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """('scheduler.tpot_slo_ms=50', ...) -> {"scheduler": {"tpot_slo_ms": 50}} (values parsed as JSON)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise BadInput(f"--set {item!r}: give SECTION.FIELD=VALUE, e.g. scheduler.tpot_slo_ms=50")
        try:
            value = loads_json(raw)
        except ValueError:
            value = raw
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


@click.command("profile")
@click.argument("engine", type=str)
@click.option(
    "--workload",
    type=click.Choice(["shared-prefix", "unique", "mixed-long-short"]),
    default="shared-prefix",
    show_default=True,
)
@click.option("--concurrency", default="8", show_default=True, help="Comma-separated levels.")
@click.option("--requests", "requests_", type=int, default=32, show_default=True, help="Requests per level.")
@click.option("--warmup-requests", type=int, default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--output-tokens", type=int, default=32, show_default=True)
@click.option("--system-tokens", type=int, default=1500, show_default=True, help="shared-prefix: S.")
@click.option("--user-tokens", default="80-120", show_default=True, help="shared-prefix: U (N or MIN-MAX).")
@click.option("--prompt-tokens", default="1550-1700", show_default=True, help="unique: prompt length.")
@click.option("--long-tokens", type=int, default=2048, show_default=True, help="mixed-long-short: long.")
@click.option("--short-tokens", default="32-128", show_default=True, help="mixed-long-short: short.")
@click.option("--long-every", type=int, default=8, show_default=True, help="mixed-long-short: 1 long in N.")
@click.option("--set", "sets", multiple=True, help="Recipe override SECTION.FIELD=VALUE (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="JSON report (with the profile).")
@click.option("--markdown", type=click.Path(dir_okay=False), default=None, help="Markdown tables.")
@click.option("--raw-profile", type=click.Path(dir_okay=False), default=None, help="Keep the raw JSONL.")
def profile(
    engine: str,
    workload: str,
    concurrency: str,
    requests_: int,
    warmup_requests: int,
    seed: int,
    output_tokens: int,
    system_tokens: int,
    user_tokens: str,
    prompt_tokens: str,
    long_tokens: int,
    short_tokens: str,
    long_every: int,
    sets: tuple[str, ...],
    out: str | None,
    markdown: str | None,
    raw_profile: str | None,
) -> None:
    """Serve ENGINE with the step profile on, run a workload, print where the time went.

    \b
    kiln profile engines/bench-optimized --concurrency 8 --requests 32 --markdown profile.md
    kiln profile engines/bench-optimized --set scheduler.tpot_slo_ms=50 --concurrency 4,8,16
    """
    folder = resolve_engine(engine).require()
    levels = parse_concurrency(concurrency)
    if requests_ <= 0 or warmup_requests < 0:
        raise BadInput("--requests must be positive and --warmup-requests zero or more")
    spec = WorkloadSpec(
        name=workload,
        num_requests=requests_needed(requests_, levels, warmup_requests),
        seed=seed,
        output_tokens=output_tokens,
        system_tokens=system_tokens,
        user_tokens=parse_range(user_tokens, "--user-tokens"),
        prompt_tokens=parse_range(prompt_tokens, "--prompt-tokens"),
        long_tokens=long_tokens,
        short_tokens=parse_range(short_tokens, "--short-tokens"),
        long_every=long_every,
    )
    wl = build_workload(load_tokenizer(folder.path), spec)
    report, _ = run_profile(
        folder.path,
        wl,
        levels,
        requests_,
        warmup_requests,
        overrides=_overrides(sets),
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
