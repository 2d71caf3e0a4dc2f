"""Two configurations of one engine, measured in paired rounds in one process: the way to see a 10% change on a VM
whose speed drifts more than that from minute to minute.

    python -m experiments.engine_ab --engine bench-ov-bf16 --a LLMKILN_CASCADE=0 --b LLMKILN_CASCADE=1 \
        --concurrency 8,32 --requests 64,128 --user-tokens 30-40 --rounds 4 --out bench/results/cascade-attention/x

Both engines are loaded in this process (side A with the environment and recipe fields of `--a`, side B with
`--b`: `NAME=VALUE` sets an environment variable while that engine loads, `SECTION.FIELD=VALUE` a recipe field),
warmed with the same requests, then every level runs on A and on B in each round, the order reversed every other
round, so each pair is measured minutes apart at most. Each round sends requests of its own (both sides the
same ones): a round repeating the last one's would find its whole prompts cached (`round_workloads`). The harness
is experiments.cpu_peer_llmkiln_inprocess's stepped loop (OpenVINO GenAI's: a finished request's successor goes in
before the next step), on the workload of experiments.cpu_peers (one 1500-token system prompt, `--user-tokens`
fresh tokens, 32 ± `--output-spread` output tokens). Writes OUT/ab.json (every round's numbers) and
OUT/SUMMARY.md: per level B ÷ A of output tokens/s, TTFT p50 and ITL p50/p99 in each round and their mean, and
the machine.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from experiments.cpu_peer_llmkiln_inprocess import stepped_loop
from experiments.cpu_peers import CpuPeersConfig, lscpu, split_workload
from llmkiln.atomic import write_text_atomic
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import Workload, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option, recipe_sets
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.loader import load_engine

PROG = "python -m experiments.engine_ab"
METRICS = ("tok/s", "TTFT p50", "ITL p50", "ITL p99")


def parse_side(spec: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """'LLMKILN_CASCADE=0,scheduler.max_num_tokens=512' -> ({env}, (recipe sets)); '' -> nothing."""
    env: dict[str, str] = {}
    sets: list[str] = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        key, eq, _ = item.partition("=")
        if not eq or not key:
            raise BadInput(
                f"{item!r}: expected NAME=VALUE (environment) or SECTION.FIELD=VALUE (recipe field)"
            )
        if "." in key:
            sets.append(item)
        else:
            env[key] = item.split("=", 1)[1]
    return env, tuple(sets)


def level_numbers(records: list[RequestRecord], seconds: float) -> dict[str, float]:
    tokens = sum(r.num_output_tokens for r in records)
    ttft = [(r.token_ns[0] - r.send_ns) / 1e6 for r in records if r.token_ns]
    itl = sorted((b - a) / 1e6 for r in records for a, b in zip(r.token_ns, r.token_ns[1:], strict=False))
    return {
        "tok/s": tokens / seconds,
        "TTFT p50": statistics.median(ttft),
        "ITL p50": itl[len(itl) // 2],
        "ITL p99": itl[min(len(itl) - 1, int(len(itl) * 0.99))],
        "requests": float(len(records)),
        "errors": float(sum(1 for r in records if not r.ok)),
    }


def _load(folder: Any, env: dict[str, str], sets: tuple[str, ...]) -> LLMEngine:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return load_engine(folder, recipe_sets(list(sets), "--a/--b") if sets else None)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def summary_markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# {data['engine']}: B ÷ A in paired rounds",
        "",
        f"A: `{data['a'] or '(as built)'}` · B: `{data['b'] or '(as built)'}` · {data['rounds']} rounds, the order "
        "reversed every other round · in-process, stepped harness (OpenVINO GenAI's) · workload: "
        f"{data['workload']}",
        "",
        f"Machine: {data['machine'].get('cpu_model', '?')} ({', '.join(data['machine'].get('isa', []))}), "
        f"{data['machine'].get('cores', '?')} cores. Command: `{data['command']}`",
        "",
        "| c | metric | A (mean) | B (mean) | B ÷ A per round | B ÷ A mean |",
        "|---:|---|---:|---:|---|---:|",
    ]
    for c, rounds in data["levels"].items():
        for m in METRICS:
            a = [r["A"][m] for r in rounds]
            b = [r["B"][m] for r in rounds]
            ratios = [y / x for x, y in zip(a, b, strict=True)]
            lines.append(
                f"| {c} | {m} | {statistics.fmean(a):.1f} | {statistics.fmean(b):.1f} | "
                f"{' / '.join(f'{r:.2f}' for r in ratios)} | **{statistics.fmean(ratios):.2f}** |"
            )
    return "\n".join(lines) + "\n"


def round_workloads(
    tok: Any, sizes: CpuPeersConfig, rounds: int
) -> tuple[Workload, Workload, list[dict[int, Workload]]]:
    """(the whole workload, the warm-up requests, per round each level's requests). Every round gets requests of
    its own: a round that sent the previous round's again would find their whole prompts in the prefix store
    (both sides alike), and measure cached prompts instead of fresh turns on a cached system prompt."""
    per_round = sum(sizes.requests)
    wl = build_workload(tok, replace(sizes.spec(), num_requests=sizes.warmup + rounds * per_round))
    warm = replace(wl, requests=wl.requests[: sizes.warmup])
    out = []
    for k in range(rounds):
        at = sizes.warmup + k * per_round
        _, levels = split_workload(
            replace(wl, requests=wl.requests[at : at + per_round]), 0, sizes.levels, sizes.requests
        )
        out.append(levels)
    return wl, warm, out


@click.command("engine-ab", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", required=True, help="An engine folder or a name under --engines-dir.")
@click.option(
    "--a",
    "side_a",
    default="",
    help="Side A: NAME=VALUE (environment) / SECTION.FIELD=VALUE, comma-separated.",
)
@click.option("--b", "side_b", default="", help="Side B, the same way.")
@click.option("--concurrency", default="8", show_default=True, help="Closed-loop levels.")
@click.option(
    "--requests",
    "requests_",
    default="64",
    show_default=True,
    help="Requests per level (one or one per level).",
)
@click.option("--user-tokens", default="30-40", show_default=True, help="Fresh tokens per request.")
@click.option("--output-spread", type=int, default=16, show_default=True, help="Output tokens 32 ± this.")
@click.option("--rounds", type=int, default=4, show_default=True)
@click.option(
    "--max-batch-size", type=int, default=32, show_default=True, help="scheduler.max_batch_size of both."
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@engines_dir_option
def cli(
    engine: str,
    side_a: str,
    side_b: str,
    concurrency: str,
    requests_: str,
    user_tokens: str,
    output_spread: int,
    rounds: int,
    max_batch_size: int,
    out_dir: Path,
    engines_dir: Path,
) -> None:
    env_a, sets_a = parse_side(side_a)
    env_b, sets_b = parse_side(side_b)
    size = f"scheduler.max_batch_size={max_batch_size}"
    sizes = CpuPeersConfig.make(
        out_dir=out_dir,
        concurrency=concurrency,
        requests=requests_,
        warmup=16,
        user_tokens=user_tokens,
        output_spread=output_spread,
    )
    folder = resolve_engine(engine, engines_dir)
    tok = load_tokenizer(folder.path)
    wl, warm, rounds_levels = round_workloads(tok, sizes, rounds)
    ids = {r.index: tok.encode(r.prompt, add_special_tokens=True).ids for r in wl.requests}
    engines = {"A": _load(folder, env_a, (size, *sets_a)), "B": _load(folder, env_b, (size, *sets_b))}
    data: dict[str, Any] = {
        "engine": str(folder.path),
        "a": side_a,
        "b": side_b,
        "rounds": rounds,
        "workload": wl.describe(),
        "machine": lscpu(),
        "command": f"{PROG} --engine {engine} --a '{side_a}' --b '{side_b}' --concurrency {concurrency} "
        f"--requests {requests_} --user-tokens {user_tokens} --output-spread {output_spread} --rounds {rounds}",
        "settings": {k: e.runner.runtime_settings for k, e in engines.items()},
        "levels": {str(c): [] for c in sizes.levels},
    }
    try:
        for e in engines.values():
            stepped_loop(e, warm.requests, ids, max(sizes.levels))
        for k, levels in enumerate(rounds_levels):
            order = ("A", "B") if k % 2 == 0 else ("B", "A")
            for c, level in levels.items():
                row: dict[str, Any] = {}
                for side in order:
                    t0 = time.perf_counter()
                    records = stepped_loop(engines[side], level.requests, ids, c)
                    row[side] = level_numbers(records, time.perf_counter() - t0)
                data["levels"][str(c)].append(row)
                click.echo(
                    f"round {k + 1} c={c}: "
                    + " | ".join(
                        f"{s}: {row[s]['tok/s']:.1f} tok/s, TTFT p50 {row[s]['TTFT p50']:.1f}" for s in "AB"
                    ),
                    err=True,
                )
    finally:
        for e in engines.values():
            e.shutdown(2.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / "ab.json", json.dumps(data, indent=2) + "\n")
    write_text_atomic(out_dir / "SUMMARY.md", summary_markdown(data))
    click.echo(out_dir / "SUMMARY.md")


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name=PROG)


if __name__ == "__main__":
    main()
