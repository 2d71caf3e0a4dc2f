"""experiments.spec_decode in rounds, the systems' order reversed every other round, and one table of the targets.

    python -m experiments.spec_decode_rounds --out bench/results/spec-decode --rounds 2 -- \
        --concurrency 1,4,8 --requests 24,32,64 --warmup 8

On these 2-core VMs the same run's throughput drifts by up to ±10% from minute to minute (measured: one
configuration twice in a row gave ×0.98 and ×1.17 over plain decoding), which is as large as the 5% the issue's
targets turn on. One round runs the systems one after the other over several minutes, so a slow minute lands on
one system. Here round k runs them in the given order (odd k) or reversed (even k), each into OUT/round-k
(a complete spec_decode result: SUMMARY.md, summary.json), and OUT/SUMMARY.md gives per workload and level each
system's output tokens/s of every round and their mean, the ratios the targets are stated in (the mean over
rounds of each round's ratio, so both sides of a ratio come from the same minutes' machine), and the targets.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

import click

from experiments.spec_decode import SYSTEMS
from experiments.spec_decode import main as spec_main
from llmkiln.atomic import write_text_atomic
from llmkiln.cli.main import run_command

PROG = "python -m experiments.spec_decode_rounds"


def _results(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return data


def _rate(r: dict[str, Any], wl: str, system: str, c: str, key: str = "output_tok_s") -> float | None:
    lv = r["results"].get(wl, {}).get(system, {}).get(c)
    return None if lv is None else lv.get(key)


def _ratios(rounds: list[dict[str, Any]], wl: str, a: str, b: str, c: str, key: str) -> list[float]:
    out = []
    for r in rounds:
        x, y = _rate(r, wl, a, c, key), _rate(r, wl, b, c, key)
        if x and y:
            out.append(x / y)
    return out


def _fmt(values: list[float], digits: int = 2) -> str:
    if not values:
        return "—"
    each = " / ".join(f"{v:.{digits}f}" for v in values)
    return f"**{statistics.fmean(values):.{digits}f}** ({each})"


def summarize(rounds: list[dict[str, Any]], command: str) -> str:
    first = rounds[0]
    levels = sorted(
        {c for r in rounds for wl in r["results"].values() for s in wl.values() for c in s}, key=int
    )
    lines = [
        "# N-gram speculative decoding on the CPU: llmkiln vs OpenVINO GenAI, in rounds",
        "",
        "Reproduce:",
        "",
        f"```\n{command}\n```",
        "",
        f"- machine: {first['machine'].get('lscpu_model_name')} ({first['machine'].get('cpu_kind')}, "
        f"{first['machine'].get('cores')} cores); engine `{first['engine']}` ({first['precision']})",
        f"- {len(rounds)} rounds (round-1 …: systems in the given order, reversed every other round); each "
        "round's full tables are in round-K/SUMMARY.md",
        "- cells: **mean** (round 1 / round 2 / …); a ratio is the mean of each round's ratio",
        "",
    ]
    for wl in first["results"]:
        lines += [
            f"## {wl}",
            "",
            "| c | " + " | ".join(f"{s} out tok/s" for s in SYSTEMS) + " |",
            "|---|" + "---:|" * len(SYSTEMS),
        ]
        for c in levels:
            cells = [_fmt([v for r in rounds if (v := _rate(r, wl, s, c)) is not None], 1) for s in SYSTEMS]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| c | ngram / plain (out tok/s) | ngram / plain (decode tok/s per request) | ngram / GenAI lookup "
            "(out tok/s) | GenAI lookup / GenAI plain | llmkiln acceptance |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c in levels:
            acc = []
            for r in rounds:
                lv = r["results"].get(wl, {}).get("llmkiln-ngram", {}).get(c)
                if lv and lv["spec"].get("acceptance") is not None:
                    acc.append(lv["spec"]["acceptance"])
            lines.append(
                f"| {c} | "
                + " | ".join(
                    [
                        _fmt(_ratios(rounds, wl, "llmkiln-ngram", "llmkiln-plain", c, "output_tok_s")),
                        _fmt(
                            _ratios(
                                rounds, wl, "llmkiln-ngram", "llmkiln-plain", c, "decode_tok_s_per_request"
                            )
                        ),
                        _fmt(_ratios(rounds, wl, "llmkiln-ngram", "ovgenai-lookup", c, "output_tok_s")),
                        _fmt(_ratios(rounds, wl, "ovgenai-lookup", "ovgenai-plain", c, "output_tok_s")),
                        _fmt(acc),
                    ]
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


@click.command("spec-decode-rounds", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--rounds", type=click.IntRange(1, 10), default=2, show_default=True)
@click.option("--systems", default=",".join(SYSTEMS), show_default=True, help="The order of round 1.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(out_dir: Path, rounds: int, systems: str, args: tuple[str, ...]) -> None:
    """Run experiments.spec_decode ROUNDS times (ARGS after `--` go to it) and summarize the rounds."""
    order = [s.strip() for s in systems.split(",") if s.strip()]
    results = []
    for k in range(1, rounds + 1):
        names = order if k % 2 else list(reversed(order))
        folder = out_dir / f"round-{k}"
        click.echo(f"== round {k}: {', '.join(names)}", err=True)
        try:
            spec_main(["--out", str(folder), "--systems", ",".join(names), *args])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        results.append(_results(folder))
    command = " ".join([PROG, *(shlex.quote(a) for a in sys.argv[1:])])
    write_text_atomic(out_dir / "SUMMARY.md", summarize(results, command))
    click.echo(f"wrote {out_dir / 'SUMMARY.md'}", err=True)


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name=PROG)


if __name__ == "__main__":
    main()
