"""The seeds' sweep on one served engine: concurrency levels × shared-prefix and unique workloads × cold and warm.

    python -m experiments.seeds_sweep --engine engines/bench-ov-bf16 --out DIR \
        [--concurrency 1,8,16,32] [--requests 32,64,64,128] [--workloads shared-prefix,unique] [--modes warm,cold]

Each run serves the engine with `kiln serve --dynamo --workers 1` (max_batch_size at least the top level) and drives
it with `kiln bench`'s closed loop (OpenAI completions, streaming, 32 ± 16 output tokens):

- **warm**: one server per workload; `--warmup` requests first (not measured: the shared prefix in the cache,
  every shape the levels run already seen), then the levels in order, each with requests of its own;
- **cold**: a fresh server per level (its start-up warmup done, the prefix cache empty) and no warm-up request:
  what the first minute after a deploy or a scale-out looks like.

The unique workload's prompts (1550-1700 tokens, none shared) never hit the prefix cache, so cold and warm differ
there only by the shapes and memory the process has touched. Writes DIR/<workload>-<mode>.json (kiln bench reports,
one level each for cold runs merged into one), DIR/summary.json and DIR/SUMMARY.md (TTFT and TPOT p50/p95/p99,
ITL p99, tokens/s, prefix hit rate per cell, the machine named). Percentiles over the level's requests: p95 needs
dozens, p99 more (the table says how many).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from experiments.cpu_peers import split_workload
from experiments.spec_decode import int_list, name_list
from llmkiln.atomic import write_text_atomic
from llmkiln.bench.report import BenchReport, machine_info, save_report
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.bench.stats import LevelStats
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer, parse_range
from llmkiln.cli.main import run_command
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput

WORKLOADS = ("shared-prefix", "unique")
MODES = ("warm", "cold")


def _bench(url: str, model: str, wl: Workload, c: int, warmup: int, label: str) -> BenchReport:
    cfg = BenchConfig(
        url=url,
        model=model,
        workload=wl,
        concurrency=[c],
        requests_per_level=len(wl.requests) - warmup,
        warmup_requests=warmup,
        label=label,
        api="completions",
        ready_timeout_s=120.0,
    )
    report, _ = run_bench(cfg)
    return report


def _merge(reports: list[BenchReport], mode: str) -> BenchReport:
    first = reports[0]
    run = first.run.model_copy(update={"mode": mode})
    samples = {k: v for r in reports for k, v in r.ttft_samples_ms.items()}
    return first.model_copy(
        update={"run": run, "levels": [lv for r in reports for lv in r.levels], "ttft_samples_ms": samples}
    )


def sweep(
    engine: Path,
    out: Path,
    levels: tuple[int, ...],
    counts: tuple[int, ...],
    workloads: tuple[str, ...],
    modes: tuple[str, ...],
    warmup: int,
    output_tokens: int,
    output_spread: int,
    prompt_tokens: str,
    user_tokens: str,
    system_tokens: int = 1500,
) -> dict[str, Any]:
    if len(set(levels)) != len(levels):
        raise BadInput(f"--concurrency {','.join(map(str, levels))}: give each level once")
    if len(counts) != len(levels):
        raise BadInput(f"--requests: {len(counts)} counts for {len(levels)} levels; give one per level")
    if any(n < c for n, c in zip(counts, levels, strict=True)):
        raise BadInput("--requests: every level needs at least as many requests as its concurrency")
    folder = EngineDir(engine).require()
    tok = load_tokenizer(engine)
    overrides = {"scheduler": {"max_batch_size": max(max(levels), folder.recipe().scheduler.max_batch_size)}}
    opts = DynamoOptions(workers=1, grace_period_s=1.0, overrides=overrides)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "engine": str(engine),
        "machine": machine_info(),
        "overrides": overrides,
        "cells": {},
    }
    for name in workloads:
        spec = WorkloadSpec(
            name=name,
            num_requests=warmup + sum(counts),
            output_tokens=output_tokens,
            output_spread=output_spread,
            prompt_tokens=parse_range(prompt_tokens, "--prompt-tokens"),
            user_tokens=parse_range(user_tokens, "--user-tokens"),
            system_tokens=system_tokens,
        )
        wl = build_workload(tok, spec)
        warm, parts = split_workload(wl, warmup, levels, counts)
        for mode in modes:
            reports: list[BenchReport] = []
            if mode == "warm":
                with serve_dynamo_engine(engine, opts) as launcher:
                    model = launcher.spec.served_model_name or folder.recipe().serve.model_name
                    for i, (c, part) in enumerate(parts.items()):
                        if i == 0:  # the warm-up requests go with the first level
                            part = replace(part, requests=warm.requests + part.requests)
                        reports.append(_bench(launcher.url, model, part, c, warmup if i == 0 else 0, "warm"))
            else:
                for c, part in parts.items():
                    t0 = time.monotonic()
                    with serve_dynamo_engine(engine, opts) as launcher:
                        model = launcher.spec.served_model_name or folder.recipe().serve.model_name
                        click.echo(
                            f"{name} cold c={c}: server ready in {time.monotonic() - t0:.1f} s", err=True
                        )
                        reports.append(_bench(launcher.url, model, part, c, 0, "cold"))
            merged = _merge(reports, mode)
            save_report(merged, out / f"{name}-{mode}.json")
            summary["cells"][f"{name}-{mode}"] = {str(lv.concurrency): _cell(lv) for lv in merged.levels}
            write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "SUMMARY.md", markdown(summary))
    return summary


def _cell(lv: LevelStats) -> dict[str, Any]:
    return {
        "requests": lv.num_ok,
        "errors": lv.num_errors,
        "ttft_ms": {k: getattr(lv.ttft_ms, k) for k in ("p50", "p95", "p99", "mean")},
        "tpot_ms": {k: getattr(lv.tpot_ms, k) for k in ("p50", "p95", "p99")},
        "itl_p99_ms": lv.itl_ms.p99,
        "tok_s": lv.output_token_throughput,
        "prefix_hit_rate": lv.prefix_hit_rate,
    }


def _f(x: float | None, nd: int = 0) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    cpu = m.get("cpu", {})
    lines = [
        f"# The seeds' sweep: {Path(summary['engine']).name} served (`kiln serve --dynamo --workers 1`)",
        "",
        f"Machine: {cpu.get('model', '?')} ({cpu.get('kind', '?')}), {m.get('cpus', '?')} CPUs; "
        f"overrides {summary['overrides']}. Closed loop, OpenAI completions, streaming. Cold: a fresh server per "
        "level, no warm-up request; warm: one server per workload, warm-up requests first. Times in ms.",
        "",
        "| workload | mode | c | n | TTFT p50 | p95 | p99 | TPOT p50 | p95 | p99 | ITL p99 | tok/s | prefix hits |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, levels in summary["cells"].items():
        name, mode = key.rsplit("-", 1)
        for c, x in levels.items():
            t, p = x["ttft_ms"], x["tpot_ms"]
            hits = "–" if x["prefix_hit_rate"] is None else f"{x['prefix_hit_rate']:.2f}"
            lines.append(
                f"| {name} | {mode} | {c} | {x['requests']} | {_f(t['p50'])} | {_f(t['p95'])} | {_f(t['p99'])} | "
                f"{_f(p['p50'], 1)} | {_f(p['p95'], 1)} | {_f(p['p99'], 1)} | {_f(x['itl_p99_ms'], 1)} | "
                f"{_f(x['tok_s'], 1)} | {hits} |"
            )
    lines += [
        "",
        "p99 over fewer than 100 requests is the slowest one or two: read it as a bound, not a rate.",
        "",
    ]
    return "\n".join(lines)


@click.command("seeds-sweep", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", "engine", type=click.Path(path_type=Path), required=True, help="Engine folder.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder for the reports.")
@click.option("--concurrency", default="1,8,16,32", show_default=True)
@click.option("--requests", "requests_", default="32,64,64,128", show_default=True, help="Per level.")
@click.option("--workloads", default=",".join(WORKLOADS), show_default=True)
@click.option("--modes", default=",".join(MODES), show_default=True)
@click.option("--warmup", type=int, default=16, show_default=True, help="Warm runs' warm-up requests.")
@click.option("--output-tokens", type=int, default=32, show_default=True)
@click.option("--output-spread", type=int, default=16, show_default=True)
@click.option("--prompt-tokens", default="1550-1700", show_default=True, help="unique: prompt length.")
@click.option("--user-tokens", default="80-120", show_default=True, help="shared-prefix: user turn length.")
@click.option(
    "--system-tokens", type=int, default=1500, show_default=True, help="shared-prefix: system prompt."
)
def cli(
    engine: Path,
    out: Path,
    concurrency: str,
    requests_: str,
    workloads: str,
    modes: str,
    warmup: int,
    output_tokens: int,
    output_spread: int,
    prompt_tokens: str,
    user_tokens: str,
    system_tokens: int,
) -> None:
    """The seeds' sweep on one served engine (cold and warm, shared-prefix and unique)."""

    if warmup < 1 and "warm" in modes:
        raise BadInput(f"--warmup {warmup}: warm runs need at least one warm-up request")
    sweep(
        engine,
        out,
        int_list(concurrency, "--concurrency"),
        int_list(requests_, "--requests"),
        name_list(workloads, WORKLOADS, "--workloads"),
        name_list(modes, MODES, "--modes"),
        warmup,
        output_tokens,
        output_spread,
        prompt_tokens,
        user_tokens,
        system_tokens,
    )
    click.echo(f"wrote {out}/SUMMARY.md")


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="python -m experiments.seeds_sweep")


if __name__ == "__main__":
    main()
