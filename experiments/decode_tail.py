"""The decode tail against TTFT: one llmkiln system served once per scheduler setting on the same requests
(CPU-speed issue, must-have 2: "bound the prefill tokens a decoding stream waits behind per step ... with the
trade-off curve (ITL p99 vs TTFT p50 over the budget) in the report").

    python -m experiments.decode_tail --out bench/results/decode-tail \
        --system bench-ov-bf16/dynamo --user-tokens 30-40 --concurrency 8 --requests 64 \
        --set scheduler.tpot_slo_ms=100 \
        --grid scheduler.max_prefill_tokens_decoding=none,256,128,64,32

Each point is experiments.cpu_peers for that one system with the grid's value added to `--set` (the shared-prefix
workload: one 1500-token system prompt, fresh user turns, 32 output tokens, seed 0: every point gets the very
same requests, on a fresh server). `--peer SUMMARY_JSON:SYSTEM` adds a peer measured on the same workload (e.g.
experiments.cpu_peer_openvino_genai with the same sizes and `--out OUT/peer`: OUT/peer/summary.json:ovgenai-bf16)
as the reference rows. Writes OUT/<value>/ (cpu_peers' reports), OUT/points.json and OUT/SUMMARY.md (the table: one row per
setting and level, the peer's rows, and each point's ITL p99 / TTFT p50 against the peer's).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from experiments.cpu_peers import CpuPeersConfig, run_cpu_peers
from llmkiln.bench.report import load_report, machine_info
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.errors import BadInput

NONE = "none"  # a grid value that leaves the field unset (the recipe's own value)


def _row(label: str, c: str, lv: dict[str, Any]) -> dict[str, Any]:
    return {
        "setting": label,
        "c": int(c),
        "ttft_p50": lv["ttft_ms"]["p50"],
        "ttft_p95": lv["ttft_ms"]["p95"],
        "itl_p50": lv["itl_ms"]["p50"],
        "itl_p99": lv["itl_ms"]["p99"],
        "tok_s": lv["output_tok_s"],
        "errors": lv["errors"],
        "n": lv["requests"],
    }


def _peer_rows(peer: str) -> list[dict[str, Any]]:
    """A peer's rows: from a BenchReport file (e.g. OUT/peer/ovgenai-bf16.json), or SUMMARY_JSON:SYSTEM."""
    if peer.endswith(".json") and Path(peer).is_file():
        try:
            rep = load_report(Path(peer))
        except (OSError, ValueError) as exc:
            raise BadInput(f"--peer {peer}: not a bench report ({exc})") from None
        return [
            {
                "setting": rep.run.label,
                "c": lv.concurrency,
                "ttft_p50": lv.ttft_ms.p50,
                "ttft_p95": lv.ttft_ms.p95,
                "itl_p50": lv.itl_ms.p50,
                "itl_p99": lv.itl_ms.p99,
                "tok_s": lv.output_token_throughput,
                "errors": lv.num_errors,
                "n": lv.num_requests,
            }
            for lv in rep.levels
        ]
    path, _, name = peer.rpartition(":")
    try:
        entry = json.loads(Path(path).read_text())["systems"].get(name) if path else None
    except (OSError, ValueError, KeyError):
        entry = None
    if entry is None:
        raise BadInput(
            f"--peer {peer!r}: give SUMMARY_JSON:SYSTEM (a cpu_peers summary.json and a system in it)"
        )
    return [_row(name, c, lv) for c, lv in entry["levels"].items()]


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def summary_markdown(meta: dict[str, Any], rows: list[dict[str, Any]], peer: list[dict[str, Any]]) -> str:
    lines = [
        "# Decode tail vs TTFT over a scheduler setting (experiments.decode_tail)",
        "",
        f"System `{meta['system']}`; grid `{meta['field']}` = {', '.join(meta['values'])}; fixed: "
        f"{meta['fixed'] or 'nothing'}. Workload shared-prefix: one {meta['system_tokens']}-token system prompt, "
        f"fresh user turns of {meta['user_tokens'][0]}-{meta['user_tokens'][1]} tokens, {meta['output_tokens']}"
        + (f" ± {meta['output_spread']}" if meta.get("output_spread") else "")
        + f" output tokens, greedy, closed loop, {meta['requests']} requests per level after {meta['warmup']} warm-up "
        "requests; every setting served fresh and sent the same requests.",
        "",
        f"Machine: {meta['machine']['cpu']['model']} ({meta['machine']['cpu']['kind']}), "
        f"{meta['machine']['cpus']} CPUs. Command: `{meta['command']}`",
        "",
        "| setting | c | TTFT p50 | TTFT p95 | ITL p50 | ITL p99 | tok/s | ITL p99 / peer | TTFT p50 / peer | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ref = {r["c"]: r for r in peer}
    for r in [*rows, *peer]:
        p = ref.get(r["c"])
        ratio_itl = r["itl_p99"] / p["itl_p99"] if p and r not in peer else None
        ratio_ttft = r["ttft_p50"] / p["ttft_p50"] if p and r not in peer else None
        lines.append(
            f"| {r['setting']} | {r['c']} | {_f(r['ttft_p50'], 0)} | {_f(r['ttft_p95'], 0)} | {_f(r['itl_p50'])} | "
            f"{_f(r['itl_p99'])} | {_f(r['tok_s'])} | {_f(ratio_itl, 2)} | {_f(ratio_ttft, 2)} | {r['errors']} |"
        )
    lines.append("")
    return "\n".join(lines)


@click.command("decode-tail", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option(
    "--system", default="bench-ov-bf16/dynamo", show_default=True, help="RECIPE/triton or RECIPE/dynamo."
)
@click.option("--grid", required=True, help="SECTION.FIELD=V1,V2,... (`none`: the recipe's own value).")
@click.option(
    "--set", "sets", multiple=True, help="Fixed recipe fields for every point, SECTION.FIELD=VALUE."
)
@click.option("--user-tokens", default="30-40", show_default=True)
@click.option(
    "--output-spread", type=int, default=0, show_default=True, help="Output tokens 32 ± this per request."
)
@click.option("--concurrency", default="8", show_default=True)
@click.option("--requests", "requests_", default="64", show_default=True)
@click.option("--warmup", type=int, default=8, show_default=True)
@click.option(
    "--peer",
    default=None,
    help="SUMMARY_JSON:SYSTEM, a peer on the same workload (e.g. OUT/peer/summary.json:ovgenai-bf16).",
)
@engines_dir_option
def cli(
    out_dir: Path,
    system: str,
    grid: str,
    sets: tuple[str, ...],
    user_tokens: str,
    output_spread: int,
    concurrency: str,
    requests_: str,
    warmup: int,
    peer: str | None,
    engines_dir: Path,
) -> None:
    field, eq, values_text = grid.partition("=")
    values = [v.strip() for v in values_text.split(",") if v.strip()]
    if not eq or "." not in field or not values:
        raise BadInput(f"--grid {grid!r}: give SECTION.FIELD=V1,V2,...")
    peer_rows = _peer_rows(peer) if peer is not None else []  # bad input before anything runs
    recipe = system.split("/", 1)[0]
    rows: list[dict[str, Any]] = []
    for value in values:
        point_sets = sets if value == NONE else (*sets, f"{field}={value}")
        cfg = CpuPeersConfig.make(
            out_dir=out_dir / value,
            recipes=recipe,
            systems=system,
            concurrency=concurrency,
            requests=requests_,
            warmup=warmup,
            user_tokens=user_tokens,
            sets=point_sets,
            output_spread=output_spread,
        )
        _, summary = run_cpu_peers(replace(cfg, engines_root=engines_dir))
        entry = summary["systems"][system]
        if entry.get("error"):
            raise click.ClickException(f"{system} with {field}={value} failed: {entry['error']}")
        rows += [_row(f"{field.split('.')[-1]}={value}", c, lv) for c, lv in entry["levels"].items()]
    meta = {
        "system": system,
        "field": field,
        "values": values,
        "fixed": ", ".join(sets),
        "system_tokens": cfg.system_tokens,
        "user_tokens": list(cfg.user_tokens),
        "output_tokens": cfg.output_tokens,
        "output_spread": output_spread,
        "requests": requests_,
        "warmup": warmup,
        "machine": machine_info(),
        "command": shlex.join(["python", "-m", "experiments.decode_tail", *sys.argv[1:]]),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "points.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "peer": peer_rows}, indent=1)
    )
    text = summary_markdown(meta, rows, peer_rows)
    (out_dir / "SUMMARY.md").write_text(text)
    click.echo(text)


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="python -m experiments.decode_tail")


if __name__ == "__main__":
    main()
