"""The seeds' experiment on the real model (`python -m experiments.chat_ttft`): multi-turn chats on
SmolLM2-135M-Instruct, the baseline recipe vs the optimized one, same weights.

Two recipes of one engine export that differ only in runtime settings: smollm2-baseline (no prefix reuse, no
chunked prefill, static batching) and smollm2-fp32 (prefix KV reuse, chunked prefill, in-flight batching,
TTFT-first). Each is served by tritonserver on free loopback ports and measured with the same seeded
chat-multiturn workload (llmkiln.bench.workloads.chat_multiturn): conversations after one long shared system
prompt, rendered with the engine's ChatML template, each request one user turn of one conversation (turn t's
prompt is a prefix of turn t+1's), closed loop over the concurrency levels. Every level gets fresh
conversations (a whole round of the workload); a few turn-1 requests of an extra round warm each server first
(warm mode: the optimized server has the system prompt cached, as a long-running one would).

Results go to OUT: one BenchReport JSON per recipe (OUT/<recipe>.json), raw per-request records under OUT/raw/
(git-ignored), summary.json and SUMMARY.md (per level: TTFT mean/p50/p95/p99, output tok/s, prefix hit rate, both
recipes side by side and the change of the mean TTFT; the machine, the date, the command). `--resummarize`
rewrites the summary from the saved reports, measuring nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from experiments.cpu_peers import lscpu
from llmkiln.backends import build
from llmkiln.bench.report import (
    BenchReport,
    load_report,
    print_report,
    save_records,
    save_report,
    write_atomic,
)
from llmkiln.bench.runner import BenchConfig, requests_needed, run_bench
from llmkiln.bench.serving import serve_engine
from llmkiln.bench.stats import LevelStats, min_samples, quotable
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput

DEFAULT_OUT = Path("bench/results/smollm2-chat")
QUICK_OUT = Path("bench/results/raw/quick/smollm2-chat")  # git-ignored: a check, not a result
MIN_REQUESTS = (
    40  # per level: p95 needs 20 samples to be quoted (llmkiln.bench.stats.quotable); 40 gives 2 beyond
)


@dataclass
class ChatConfig:
    """Sizes of the experiment. The defaults take ≈ 15 minutes on 2 idle cores (docstring of `cli`)."""

    out_dir: Path = DEFAULT_OUT
    engines_root: Path | None = None  # None: $LLMKILN_ENGINES or ./engines
    baseline: str = "smollm2-baseline"
    optimized: str = "smollm2-fp32"
    seed: int = 0
    levels: tuple[int, ...] = (1, 8, 16, 32)
    # Sizes (see `cli`'s docstring for the time they take): the baseline prefills every prompt whole (~5 ms a
    # token on 2 cores) and decodes 32 tokens (~70 ms a step at c=1), so the run grows by ~1 s per prompt token
    # of the mean prompt over 4 x 48 requests; these prompts (~370 tokens on average) keep it near 15 minutes.
    requests: int = 48  # per level: num_conversations = requests / num_turns fresh conversations (16)
    warmup: int = 2  # turn-1 requests of an extra round, per server, not measured
    num_turns: int = 3  # 16 conversations: more than the concurrency up to c=8, as many as c=16
    system_tokens: int = 512  # a long shared system prompt: the baseline prefills it every time
    user_tokens: tuple[int, int] = (20, 40)
    assistant_tokens: int = 32
    output_tokens: int = 32
    timeout_s: float = 900.0
    quick: bool = False

    @property
    def num_conversations(self) -> int:
        return self.requests // self.num_turns

    def check(self) -> None:
        if self.requests % self.num_turns:
            raise BadInput(
                f"--requests {self.requests}: give a multiple of --turns ({self.num_turns}), so that every "
                "level is whole conversations"
            )
        if not self.quick and self.requests < MIN_REQUESTS:
            raise BadInput(
                f"--requests {self.requests}: at least {MIN_REQUESTS} per level, so p95 means something"
            )
        if self.requests < max(self.levels):
            raise BadInput(
                f"--requests {self.requests}: at least the highest level ({max(self.levels)}), else the level "
                "never has that many requests in flight"
            )
        if not 0 <= self.warmup <= self.num_conversations:
            raise BadInput(
                f"--warmup {self.warmup}: between 0 and {self.num_conversations} (one round's turn 1)"
            )

    def spec(self, chat_template: str | None) -> WorkloadSpec:
        """One round of conversations per level plus one for the warmup."""
        return WorkloadSpec(
            name="chat-multiturn",
            num_requests=self.requests * (len(self.levels) + 1),
            seed=self.seed,
            output_tokens=self.output_tokens,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            assistant_tokens=self.assistant_tokens,
            num_conversations=self.num_conversations,
            num_turns=self.num_turns,
            chat_template=chat_template,
        )

    def command(self) -> str:
        """The command line that repeats this run."""
        args = ["python", "-m", "experiments.chat_ttft", "--out", str(self.out_dir)]
        if self.quick:
            args.append("--quick")
        args += ["--baseline", self.baseline, "--optimized", self.optimized]
        args += ["--levels", ",".join(map(str, self.levels)), "--requests", str(self.requests)]
        args += ["--turns", str(self.num_turns), "--system-tokens", str(self.system_tokens)]
        args += ["--user-tokens", "-".join(map(str, self.user_tokens))]
        args += ["--assistant-tokens", str(self.assistant_tokens), "--output-tokens", str(self.output_tokens)]
        args += ["--warmup", str(self.warmup), "--seed", str(self.seed)]
        if self.engines_root is not None:
            args += ["--engines-dir", str(self.engines_root)]
        return shlex.join(args)


QUICK = {  # ~2-3 minutes: 2 levels of 4 conversations x 2 turns; same code paths, shorter prompts
    "levels": (1, 4),
    "requests": 8,
    "warmup": 1,
    "num_turns": 2,
    "system_tokens": 256,
    "user_tokens": (16, 32),
    "assistant_tokens": 24,
    "output_tokens": 16,
}


def with_warmup_first(wl: Workload, warmup: int, per_round: int) -> Workload:
    """The first `warmup` requests of round 0 (turn-1 requests), then rounds 1.. whole (one per level), re-indexed:
    what BenchConfig expects (warmup, then each level's slice in order)."""
    reqs = [*wl.requests[:warmup], *wl.requests[per_round:]]
    reqs = [replace(r, index=i) for i, r in enumerate(reqs)]
    params = {**wl.params, "num_requests": len(reqs), "warmup_from_extra_round": warmup}
    return Workload(wl.name, wl.seed, params, reqs)


def run_experiment(cfg: ChatConfig, console: Console | None = None) -> tuple[Path, dict[str, Any]]:
    """Build both recipes, serve and measure each; write the reports and the summary."""
    console = console or Console()
    cfg.check()
    t0 = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)
    out = Path(cfg.out_dir)
    engines = {r: build(r, cfg.engines_root).engine_dir for r in (cfg.baseline, cfg.optimized)}
    template = EngineDir(engines[cfg.optimized]).chat_template()
    if template != EngineDir(engines[cfg.baseline]).chat_template():
        raise BadInput(
            f"{cfg.baseline} and {cfg.optimized} have different chat templates: not the same model"
        )
    tok = load_tokenizer(engines[cfg.optimized])
    wl = with_warmup_first(build_workload(tok, cfg.spec(template)), cfg.warmup, cfg.requests)
    assert len(wl.requests) == requests_needed(cfg.requests, cfg.levels, cfg.warmup)
    reports: dict[str, BenchReport] = {}
    for recipe, engine_dir in engines.items():
        console.rule(f"{recipe}: serving {engine_dir}")
        with serve_engine(engine_dir) as served:
            console.print(f"ready in {served.ready_s:.1f} s at {served.url}")
            report, records = run_bench(
                BenchConfig(
                    url=served.url,
                    model=served.model,
                    workload=wl,
                    concurrency=cfg.levels,
                    requests_per_level=cfg.requests,
                    warmup_requests=cfg.warmup,
                    label=recipe,
                    timeout_s=cfg.timeout_s,
                    extra={"recipe": recipe, "engine_dir": str(engine_dir), "server_ready_s": served.ready_s},
                )
            )
        print_report(report, console)
        save_records(records, out / "raw" / f"{recipe}.jsonl")
        save_report(report, out / f"{recipe}.json")
        reports[recipe] = report
    run = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "command": cfg.command(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - t0, 1),
        "machine": lscpu() | {"loadavg_start": load_start, "loadavg_end": round(os.getloadavg()[0], 2)},
    }
    return write_summary(out, run, reports[cfg.baseline], reports[cfg.optimized])


def write_summary(
    out: Path, run: dict[str, Any], baseline: BenchReport, optimized: BenchReport
) -> tuple[Path, dict[str, Any]]:
    summary = summarize(run, baseline, optimized)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", markdown(summary))
    return out / "SUMMARY.md", summary


def resummarize(out: Path) -> tuple[Path, dict[str, Any]]:
    """Rewrite SUMMARY.md and summary.json from the saved reports in `out` (nothing is measured)."""
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(f"{saved}: no finished run there; run `python -m experiments.chat_ttft --out {out}`")
    old = json.loads(saved.read_text(encoding="utf-8"))
    run = {k: old[k] for k in ("config", "command", "date", "wall_s", "machine")}
    cfg = run["config"]
    return write_summary(
        out, run, load_report(out / f"{cfg['baseline']}.json"), load_report(out / f"{cfg['optimized']}.json")
    )


# ---------------------------------------------------------------------------------------------------------------
# The summary


def _side(lv: LevelStats) -> dict[str, Any]:
    t = lv.ttft_ms
    return {
        "requests": lv.num_requests,
        "errors": lv.num_errors,
        "ttft_mean_ms": t.mean,
        "ttft_p50_ms": t.p50,
        "ttft_p95_ms": quotable(t, 95),  # None below 20 samples
        "ttft_p99_ms": t.p99,  # quoted as measured; it rests on fewer than 100 samples (flagged in SUMMARY.md)
        "ttft_p99_quotable": t.count >= min_samples(99),
        "output_tok_s": lv.output_token_throughput,
        "output_tokens_mean": lv.output_tokens_mean,
        "prompt_tokens_mean": lv.prompt_tokens_mean,
        "prefix_hit_rate": lv.prefix_hit_rate,
        "ttft_mean_ms_by_turn": {g: s.ttft_ms.mean for g, s in sorted(lv.groups.items())},
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def summarize(run: dict[str, Any], baseline: BenchReport, optimized: BenchReport) -> dict[str, Any]:
    """Per level, both recipes side by side and optimized/baseline ratios (change = ratio - 1)."""
    levels = []
    for lb in baseline.levels:
        lo = optimized.level(lb.concurrency)
        if lo is None:
            continue
        b, o = _side(lb), _side(lo)
        ratios = {k: _ratio(b[f"ttft_{k}_ms"], o[f"ttft_{k}_ms"]) for k in ("mean", "p50", "p95", "p99")} | {
            "output_tok_s": _ratio(b["output_tok_s"], o["output_tok_s"])
        }
        change = ratios["mean"] - 1 if ratios["mean"] is not None else None
        levels.append(
            {
                "concurrency": lb.concurrency,
                "baseline": b,
                "optimized": o,
                "ratio": ratios,
                "ttft_mean_change": change,
            }
        )
    return {
        "experiment": "chat-ttft",
        **run,
        "baseline": baseline.run.label,
        "optimized": optimized.run.label,
        "workload": baseline.run.workload,
        "levels": levels,
    }


def _s(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.2f} s"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def _change(ch: float | None) -> str:
    """-0.77 -> '−77%' (a minus sign, as in the mission's numbers)."""
    return "n/a" if ch is None else f"{ch * 100:+.0f}%".replace("-", "−")


def headline(level: dict[str, Any]) -> str:
    """'c=8: mean TTFT 1.80 s → 0.41 s (−77%)'."""
    b, o = level["baseline"], level["optimized"]
    shown = _change(level["ttft_mean_change"])
    return f"c={level['concurrency']}: mean TTFT {_s(b['ttft_mean_ms'])} → {_s(o['ttft_mean_ms'])} ({shown})"


def markdown(summary: dict[str, Any]) -> str:
    cfg, m, p = summary["config"], summary["machine"], summary["workload"]["params"]
    base, opt = summary["baseline"], summary["optimized"]
    lines = [
        f"# Chat TTFT on SmolLM2-135M-Instruct: {base} vs {opt}",
        "",
        "Same weights, same ONNX export; the recipes differ only in runtime settings (the baseline: no prefix KV "
        "reuse, no chunked prefill, static batching; the optimized: prefix reuse, chunked prefill, in-flight "
        "batching, TTFT-first). Both served by tritonserver, measured over gRPC in a closed loop.",
        "",
        *(f"- {headline(lv)}" for lv in summary["levels"]),
        "",
        f"Workload `chat-multiturn` (seed {summary['workload']['seed']}): one shared system prompt of "
        f"{p['system_tokens']} tokens, {p['num_conversations']} conversations × {p['num_turns']} user turns "
        f"({p['user_tokens'][0]}–{p['user_tokens'][1]} tokens each) with canned {p['assistant_tokens']}-token "
        "assistant replies (not the model's), rendered with the engine's ChatML template; turn t's prompt is a "
        "prefix of turn t+1's. Requests interleaved turn by turn; every level gets fresh conversations; "
        f"{cfg['warmup']} warmup request(s) per server (turn 1 of other conversations, not measured). "
        f"{cfg['requests']} requests per level, {p['output_tokens']} output tokens at most (greedy; a reply "
        "can end earlier at the model's end token).",
        "",
        "| c | TTFT mean | p50 | p95 | p99 | output tok/s | prefix hit | mean TTFT change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    flag_p99 = False
    for lv in summary["levels"]:
        b, o = lv["baseline"], lv["optimized"]
        flag_p99 |= not (b["ttft_p99_quotable"] and o["ttft_p99_quotable"])
        mark = "" if b["ttft_p99_quotable"] and o["ttft_p99_quotable"] else " ¹"

        def pair(key: str, fmt: Any, b: dict = b, o: dict = o) -> str:
            return f"{fmt(b[key])} → {fmt(o[key])}"

        lines.append(
            f"| {lv['concurrency']} | {pair('ttft_mean_ms', _s)} | {pair('ttft_p50_ms', _s)} | "
            f"{pair('ttft_p95_ms', _s)} | {pair('ttft_p99_ms', _s)}{mark} | "
            f"{pair('output_tok_s', lambda v: f'{v:.1f}')} | {pair('prefix_hit_rate', _pct)} | "
            f"{_change(lv['ttft_mean_change'])} |"
        )
    lines += ["", f"Each cell: {base} → {opt}."]
    if flag_p99:
        lines.append(
            "¹ p99 of fewer than 100 requests: close to the level's slowest request, not a stable tail estimate."
        )
    lines += [
        "",
        "Ratios optimized / baseline (TTFT: lower is better; output tok/s: higher is better):",
        "",
        "| c | mean | p50 | p95 | p99 | output tok/s | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in summary["levels"]:
        r = lv["ratio"]
        errors = f"{lv['baseline']['errors']} / {lv['optimized']['errors']}"
        lines.append(
            f"| {lv['concurrency']} | {_x(r['mean'])} | {_x(r['p50'])} | {_x(r['p95'])} | {_x(r['p99'])} | "
            f"{_x(r['output_tok_s'])} | {errors} |"
        )
    turns = sorted({g for lv in summary["levels"] for g in lv["baseline"]["ttft_mean_ms_by_turn"]})
    lines += [
        "",
        "Mean TTFT by turn (baseline → optimized; later turns have longer prompts, and on the optimized server "
        "can reuse the previous turn's KV blocks):",
        "",
        "| c | " + " | ".join(turns) + " |",
        "|---|" + "---|" * len(turns),
    ]
    for lv in summary["levels"]:
        tb, to = lv["baseline"]["ttft_mean_ms_by_turn"], lv["optimized"]["ttft_mean_ms_by_turn"]
        cells = [f"{_s(tb.get(t))} → {_s(to.get(t))}" for t in turns]
        lines.append(f"| {lv['concurrency']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Prompt tokens per request (mean, whole prompt): "
        + ", ".join(
            f"c={lv['concurrency']}: {_n(lv['baseline']['prompt_tokens_mean'])}" for lv in summary["levels"]
        )
        + ".",
        "",
        f"Machine: {m.get('cpu_model')} ({m.get('cpu_id')}, {m.get('hypervisor') or 'no hypervisor'}), "
        f"{m.get('cores')} cores, load average {m.get('loadavg_start')} at the start. Date: {summary['date']}. "
        f"Wall time: {summary['wall_s'] / 60:.1f} min.",
        "",
        "```",
        summary["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The command


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) <= 0 or len(set(levels)) != len(levels):
        raise BadInput(
            f"--levels {text!r}: give distinct positive integers separated by commas, e.g. 1,8,16,32"
        )
    return levels


def _range(text: str) -> tuple[int, int]:
    parts = text.split("-")
    try:
        lo, hi = int(parts[0]), int(parts[-1])
    except ValueError:
        lo, hi = 0, -1
    if len(parts) > 2 or lo <= 0 or hi < lo:
        raise BadInput(f"--user-tokens {text!r}: give N or MIN-MAX with 0 < MIN <= MAX")
    return lo, hi


@click.command("chat_ttft", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--quick",
    is_flag=True,
    help="2 levels, 8 requests each, short prompts (~3 min; under bench/results/raw).",
)
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False), default=None, help=f"[default: {DEFAULT_OUT}]"
)
@click.option("--baseline", default="smollm2-baseline", show_default=True)
@click.option("--optimized", default="smollm2-fp32", show_default=True)
@click.option("--levels", default=None, help="Concurrency levels [default: 1,8,16,32].")
@click.option("--requests", "requests_", type=int, default=None, help="Requests per level [default: 48].")
@click.option("--turns", type=int, default=None, help="User turns per conversation [default: 3].")
@click.option("--system-tokens", type=int, default=None, help="[default: 256]")
@click.option("--user-tokens", default=None, help="User turn tokens, MIN-MAX [default: 20-40].")
@click.option("--assistant-tokens", type=int, default=None, help="Canned reply tokens [default: 32].")
@click.option("--output-tokens", type=int, default=None, help="max_tokens per request [default: 32].")
@click.option("--warmup", type=int, default=None, help="Warmup requests per server [default: 2].")
@click.option("--seed", type=int, default=0, show_default=True)
@engines_dir_option
@click.option(
    "--resummarize", "resummarize_only", is_flag=True, help="Measure nothing: rewrite the summary in --out."
)
def cli(
    quick: bool,
    out_dir: str | None,
    baseline: str,
    optimized: str,
    levels: str | None,
    requests_: int | None,
    turns: int | None,
    system_tokens: int | None,
    user_tokens: str | None,
    assistant_tokens: int | None,
    output_tokens: int | None,
    warmup: int | None,
    seed: int,
    engines_dir: Path,
    resummarize_only: bool,
) -> None:
    """Multi-turn chat TTFT on SmolLM2-135M-Instruct: smollm2-baseline vs smollm2-fp32, served by tritonserver.

    \b
    python -m experiments.chat_ttft                      (≈ 15 minutes on 2 idle cores: bench/results/smollm2-chat)
    python -m experiments.chat_ttft --quick              (≈ 3 minutes: bench/results/raw/quick/smollm2-chat)
    python -m experiments.chat_ttft --resummarize --out bench/results/smollm2-chat

    Defaults per level: 16 fresh conversations x 3 user turns (20-40 tokens) after a 256-token system prompt, with
    32-token canned replies: prompts of ~300-450 tokens (~370 on average), 32 output tokens. Estimated from two
    short runs on 2 cores (8-12 requests at c=1 and c=8, scaled to 48 requests and four levels): the baseline,
    which prefills every prompt whole, ~10 minutes; the optimized server, which prefills only what it has not
    cached, ~6; about 16 minutes in all with the builds and server starts (~20 when the cores are shared with
    other work). A 600-token system prompt with 4 turns of 30-60 tokens (~800-token prompts) takes ~23-25.
    """
    if resummarize_only:
        path, summary = resummarize(Path(out_dir or DEFAULT_OUT))
        click.echo(f"rewrote {path} from the saved reports")
        for lv in summary["levels"]:
            click.echo("  " + headline(lv))
        return
    cfg = ChatConfig(baseline=baseline, optimized=optimized, seed=seed, engines_root=engines_dir)
    if quick:
        cfg = replace(cfg, quick=True, out_dir=QUICK_OUT, **QUICK)
    given = {
        "levels": _levels(levels) if levels else None,
        "requests": requests_,
        "num_turns": turns,
        "system_tokens": system_tokens,
        "user_tokens": _range(user_tokens) if user_tokens else None,
        "assistant_tokens": assistant_tokens,
        "output_tokens": output_tokens,
        "warmup": warmup,
        "out_dir": Path(out_dir) if out_dir else None,
    }
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    for name in ("num_turns", "system_tokens", "assistant_tokens", "output_tokens", "requests"):
        if getattr(cfg, name) <= 0:
            raise BadInput(f"--{name.replace('num_', '').replace('_', '-')} must be positive")
    path, summary = run_experiment(cfg)
    click.echo(f"\nwrote {path} (and the reports next to it)")
    for lv in summary["levels"]:
        click.echo("  " + headline(lv))


def main(argv: list[str] | None = None) -> None:
    """Exit codes as kiln's: 0 ok, 1 failure, 2 bad input."""
    run_command(cli, argv, prog_name="python -m experiments.chat_ttft")


if __name__ == "__main__":
    main()
