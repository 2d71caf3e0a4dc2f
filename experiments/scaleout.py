"""The scale-out experiment (`make bench-scaleout` = `python -m experiments.scaleout --out bench/results/scaleout`):
Dynamo scale-out, KV-aware routing vs round-robin, one worker vs two, on one engine (bench-llama-125m, recipe
bench-optimized).

Workload: K = 4 system prompts of ~1500 tokens, each request draws one (seeded) and adds its own user turn,
through the OpenAI chat endpoint. Configurations, each a fresh launch (`kiln serve --dynamo`) measured with the
same requests:
- `kv-2w`: two workers (one core each) whose prefix stores hold about half of the prompts each, KV router;
- `round-robin-2w`: the same workers, round-robin router (each worker sees every prompt: its store thrashes);
- `kv-1w`: one worker (both cores) whose store holds every prompt: the hit rate to match.
Warm mode: before the measured requests each system prompt is sent once, one request at a time (so each has a
home before the burst; a burst of cold requests would spread one prompt over both workers before any KV event
arrives). Closed loop at concurrency 8, then an open loop (Poisson arrivals) with
goodput under an SLO for the two-worker configurations. The prefix hit rate is cached / prompt tokens from the
responses' usage; per-worker counters come from each worker's /metrics. Results: OUT_DIR/<config>.json (+
<config>-open.json), summary.json and SUMMARY.md; raw per-request JSONL under bench/results/raw/scaleout/.
`--resummarize` measures nothing and rewrites SUMMARY.md from summary.json.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from llmkiln.backends import build
from llmkiln.bench.report import BenchReport, print_report, save_records, save_report, write_atomic
from llmkiln.bench.runner import BenchConfig, requests_needed, run_bench
from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.bench.stats import Slo
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.dynamo.cluster import available_cores
from llmkiln.dynamo.launcher import DynamoLauncher
from llmkiln.dynamo.options import DynamoOptions, RouterMode
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.runtime.kv_quant import bytes_per_block


@dataclass(frozen=True)
class Setup:
    """One configuration: workers, router and how many system prompts each worker's store holds."""

    name: str
    workers: int
    router_mode: RouterMode
    prompts_per_store: int  # system prompts a worker's prefix store has room for (plus the user-turn slack)
    open_loop: bool = True


SETUPS = (
    Setup("kv-2w", 2, "kv", 2),
    Setup("round-robin-2w", 2, "round-robin", 2),
    Setup("kv-1w", 1, "kv", 4, open_loop=False),
)


@dataclass(frozen=True)
class ScaleoutConfig:
    """Sizes of the scale-out benchmark (defaults: the committed run, ≈ 10 minutes on 2 idle cores)."""

    out_dir: Path = Path("bench/results/scaleout")
    raw_dir: Path = Path("bench/results/raw/scaleout")
    engines_root: Path | None = None  # None: $LLMKILN_ENGINES or ./engines
    recipe: str = "bench-optimized"
    seed: int = 0
    system_prompts: int = 4
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (32, 96)
    output_tokens: int = 32
    concurrency: int = 8
    requests: int = 32
    request_rate: float = 1.0  # open loop, requests/s
    open_requests: int = 32
    slo: Slo = field(default_factory=lambda: Slo(ttft_ms=1000.0, tpot_ms=100.0))
    slack_blocks: int = 32  # per store, beyond its prompts: the user turns of requests in flight
    setups: tuple[Setup, ...] = SETUPS
    timeout_s: float = 900.0

    @classmethod
    def make(
        cls, quick: bool = False, requests: int | None = None, out_dir: Path | None = None
    ) -> ScaleoutConfig:
        cfg = cls()
        if quick:  # a check of the harness in minutes: shorter prompts, fewer requests; same code paths
            cfg = replace(
                cfg,
                system_tokens=400,
                user_tokens=(16, 32),
                output_tokens=8,
                requests=8,
                open_requests=8,
                request_rate=2.0,
                out_dir=Path("bench/results/raw/scaleout-quick"),
            )
        if requests is not None:
            if requests <= 0:
                raise BadInput(f"--requests must be positive, got {requests}")
            cfg = replace(cfg, requests=requests, open_requests=requests)
        if out_dir is not None:
            cfg = replace(cfg, out_dir=Path(out_dir))
        return cfg

    @property
    def warm_pool(self) -> int:
        """Requests reserved for the warmup, from which one per system prompt is sent."""
        return 4 * self.system_prompts

    def workload_spec(self) -> WorkloadSpec:
        n = self.warm_pool + requests_needed(self.requests, (self.concurrency,), 0) + self.open_requests
        return WorkloadSpec(
            name="shared-prefix",
            num_requests=n,
            seed=self.seed,
            output_tokens=self.output_tokens,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            num_system_prompts=self.system_prompts,
        )


def store_bytes(engine: Path, cfg: ScaleoutConfig, prompts: int) -> int:
    """Prefix-store bytes that hold `prompts` system prompts (chat template included) plus the slack."""
    folder = EngineDir(engine)
    recipe, info = folder.recipe(), folder.genai_config()
    bs = recipe.kv_cache.tokens_per_block
    per_prompt = (cfg.system_tokens + 16) // bs + 1  # + the chat template's few tokens
    blocks = prompts * per_prompt + cfg.slack_blocks
    return blocks * bytes_per_block(recipe.kv_cache.dtype, info.num_layers, info.kv_heads, bs, info.head_size)


def run_scaleout(cfg: ScaleoutConfig, console: Console | None = None) -> tuple[Path, dict[str, Any]]:
    """Run every setup; write the reports, summary.json and SUMMARY.md. Returns the SUMMARY.md path."""
    console = console or Console()
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    engine = build(cfg.recipe, cfg.engines_root).engine_dir
    tok = load_tokenizer(engine)
    workload = build_workload(tok, cfg.workload_spec())
    pool = workload.requests[: cfg.warm_pool]
    firsts = {r.group: r for r in reversed(pool)}  # the first request of each system prompt
    warm = replace(workload, requests=sorted(firsts.values(), key=lambda r: r.index))
    closed_n = cfg.warm_pool + requests_needed(cfg.requests, (cfg.concurrency,), 0)
    closed = replace(workload, requests=workload.requests[cfg.warm_pool : closed_n])
    opened = replace(workload, requests=workload.requests[closed_n:])
    out = Path(cfg.out_dir)
    results: dict[str, dict[str, Any]] = {}
    for setup in cfg.setups:
        console.rule(f"{setup.name}: {setup.workers} worker(s), router {setup.router_mode}")
        results[setup.name] = _run_setup(cfg, setup, engine, warm, closed, opened, out, console)
    summary = {
        "config": _config_dump(cfg),
        "engine": str(engine),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cores": available_cores(),
        "setups": results,
        "targets": targets(results),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))
    return out / "SUMMARY.md", summary


def _run_setup(
    cfg: ScaleoutConfig,
    setup: Setup,
    engine: Path,
    warm: Workload,
    closed: Workload,
    opened: Workload,
    out: Path,
    console: Console,
) -> dict[str, Any]:
    opts = DynamoOptions(
        workers=setup.workers,
        router_mode=setup.router_mode,
        grace_period_s=1.0,
        overrides={"kv_cache": {"max_bytes": store_bytes(engine, cfg, setup.prompts_per_store)}},
    )
    with serve_dynamo_engine(engine, opts) as launcher:
        result: dict[str, Any] = {
            "workers": setup.workers,
            "router_mode": setup.router_mode,
            "threads_per_worker": launcher.spec.threads,
            "prompts_per_store": setup.prompts_per_store,
        }
        result["store_blocks"] = launcher.worker_metrics(0)["kv_blocks_total"]
        model = launcher.spec.served_model_name or EngineDir(engine).recipe().serve.model_name
        warmup = BenchConfig(
            url=launcher.url,
            model=model,
            workload=warm,
            concurrency=(len(warm.requests),),
            requests_per_level=len(warm.requests),
            label=f"{setup.name}-warmup",
            timeout_s=cfg.timeout_s,
            api="chat",
            progress=False,
        )
        # one request per system prompt, sent together (not measured): the router spreads cold prompts by load;
        # one at a time, an idle router puts every cold prompt on the same worker (a tie on load)
        run_bench(warmup)
        bench = BenchConfig(
            url=launcher.url,
            model=model,
            workload=closed,
            concurrency=(cfg.concurrency,),
            requests_per_level=cfg.requests,
            warmup_requests=0,
            label=setup.name,
            timeout_s=cfg.timeout_s,
            api="chat",
            slo=cfg.slo,
            seed=cfg.seed,
            extra={"setup": asdict(setup), "engine": str(engine), "store_blocks": result["store_blocks"]},
        )
        before = [launcher.worker_metrics(i) for i in range(setup.workers)]
        report, records = run_bench(bench)
        report.run.mode, report.run.warmup_requests = (
            "warm",
            len(warm.requests),
        )  # warmed above, one at a time
        print_report(report, console)
        save_report(report, out / f"{setup.name}.json")
        save_records(records, cfg.raw_dir / f"{setup.name}.jsonl")
        result["closed"] = _level_summary(report)
        result["per_worker"] = _per_worker(launcher, before)
        if setup.open_loop and cfg.open_requests:
            open_cfg = replace(
                bench,
                workload=opened,
                requests_per_level=cfg.open_requests,
                warmup_requests=0,
                request_rate=cfg.request_rate,
                label=f"{setup.name}-open",
                concurrency=(cfg.open_requests,),  # the bound on requests in flight: never binding
            )
            report, records = run_bench(open_cfg)
            print_report(report, console)
            save_report(report, out / f"{setup.name}-open.json")
            save_records(records, cfg.raw_dir / f"{setup.name}-open.jsonl")
            result["open"] = _level_summary(report)
    return result


def _per_worker(launcher: DynamoLauncher, before: list[dict[str, float]]) -> list[dict[str, float]]:
    out = []
    for i, b in enumerate(before):
        m = launcher.worker_metrics(i)
        out.append(
            {
                "requests": m["requests_finished"] - b["requests_finished"],
                "prompt_tokens_computed": m["prompt_tokens_computed"] - b["prompt_tokens_computed"],
                "prefix_hit_tokens": m["prefix_cache_hit_tokens"] - b["prefix_cache_hit_tokens"],
                "blocks_evicted": m["kv_blocks_evicted"] - b["kv_blocks_evicted"],
            }
        )
    return out


def _level_summary(report: BenchReport) -> dict[str, Any]:
    lv = report.levels[0]
    return {
        "requests": lv.num_requests,
        "errors": lv.num_errors,
        "concurrency": lv.concurrency,
        "request_rate": lv.request_rate,
        "prefix_hit_rate": lv.prefix_hit_rate,
        "ttft_ms": {"p50": lv.ttft_ms.p50, "p95": lv.ttft_ms.p95, "mean": lv.ttft_ms.mean},
        "tpot_ms": {"p50": lv.tpot_ms.p50, "p95": lv.tpot_ms.p95},
        "e2e_ms": {"p50": lv.e2e_ms.p50, "p95": lv.e2e_ms.p95},
        "request_throughput": lv.request_throughput,
        "output_token_throughput": lv.output_token_throughput,
        "goodput": lv.goodput.model_dump() if lv.goodput is not None else None,
    }


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets: KV routing's hit rate within 10% of one worker holding everything; KV routing's
    TTFT p50 at most half of round-robin's (closed loop)."""
    out = []
    kv, rr, one = (results.get(n, {}).get("closed") for n in ("kv-2w", "round-robin-2w", "kv-1w"))
    if kv and one and kv["prefix_hit_rate"] is not None and one["prefix_hit_rate"]:
        ratio = kv["prefix_hit_rate"] / one["prefix_hit_rate"]
        out.append({"target": "hit rate kv-2w / kv-1w >= 0.9", "value": ratio, "met": ratio >= 0.9})
    if kv and rr and kv["ttft_ms"]["p50"] is not None and rr["ttft_ms"]["p50"]:
        ratio = kv["ttft_ms"]["p50"] / rr["ttft_ms"]["p50"]
        out.append({"target": "TTFT p50 kv-2w / round-robin-2w <= 0.5", "value": ratio, "met": ratio <= 0.5})
    return out


def _fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def summary_markdown(summary: dict[str, Any]) -> str:
    cfg, setups = summary["config"], summary["setups"]
    lines = [
        "# bench-scaleout: Dynamo, KV-aware routing vs round-robin, one worker vs two",
        "",
        f"Engine `{cfg['recipe']}` (bench-llama-125m, fp32) served by `kiln serve --dynamo` on loopback; OpenAI chat "
        f"endpoint; {cfg['system_prompts']} system prompts of {cfg['system_tokens']} tokens, user turns of "
        f"{cfg['user_tokens'][0]}-{cfg['user_tokens'][1]} tokens, {cfg['output_tokens']} output tokens, greedy.",
        f"Machine: {summary['cores']} cores; load average (1/5/15 min) {summary['loadavg_start']} at the start, "
        f"{summary['loadavg_end']} at the end; whole run {summary['wall_s'] / 60:.1f} min.",
        "",
        f"## Closed loop, concurrency {cfg['concurrency']} ({cfg['requests']} requests per setup, after one "
        "warmup request per system prompt, sent together)",
        "",
        "| setup | workers × threads | store (blocks, prompts) | prefix hit rate | TTFT p50 ms | TTFT p95 ms | "
        "TPOT p50 ms | out tok/s | requests per worker | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, s in setups.items():
        c = s["closed"]
        split = " / ".join(str(int(w["requests"])) for w in s["per_worker"])
        lines.append(
            f"| {name} | {s['workers']} × {s['threads_per_worker']} | {int(s['store_blocks'])}, "
            f"{s['prompts_per_store']} | {_fmt(c['prefix_hit_rate'], '.3f')} | {_fmt(c['ttft_ms']['p50'])} | "
            f"{_fmt(c['ttft_ms']['p95'])} | {_fmt(c['tpot_ms']['p50'], '.1f')} | "
            f"{_fmt(c['output_token_throughput'], '.1f')} | {split} | {c['errors']} |"
        )
    opened = {n: s["open"] for n, s in setups.items() if "open" in s}
    if opened:
        slo = next(iter(opened.values()))["goodput"]["slo"]
        lines += [
            "",
            f"## Open loop, Poisson arrivals at {cfg['request_rate']:g} requests/s ({cfg['open_requests']} requests)",
            "",
            f"Goodput: requests per second meeting TTFT ≤ {slo['ttft_ms']:g} ms and TPOT ≤ {slo['tpot_ms']:g} ms.",
            "",
            "| setup | prefix hit rate | TTFT p50 ms | TTFT p95 ms | TPOT p95 ms | goodput req/s | SLO attainment | "
            "TTFT p95 ≤ SLO | TPOT p95 ≤ SLO |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for name, o in opened.items():
            g = o["goodput"]
            lines.append(
                f"| {name} | {_fmt(o['prefix_hit_rate'], '.3f')} | {_fmt(o['ttft_ms']['p50'])} | "
                f"{_fmt(o['ttft_ms']['p95'])} | {_fmt(o['tpot_ms']['p95'], '.1f')} | {g['goodput_rps']:.2f} | "
                f"{g['attainment']:.0%} | {'yes' if g['ttft_p95_met'] else 'no'} | {'yes' if g['tpot_p95_met'] else 'no'} |"
            )
    lines += ["", "## Targets", ""]
    for t in summary["targets"]:
        lines.append(f"- {'met' if t['met'] else 'NOT met'}: {t['target']} (measured {t['value']:.2f})")
    lines += [
        "",
        "Reproduce: `make bench-scaleout` (= `python -m experiments.scaleout --out bench/results/scaleout`); "
        "`python -m experiments.scaleout --quick` checks the harness in minutes.",
        "",
    ]
    return "\n".join(lines)


def _config_dump(cfg: ScaleoutConfig) -> dict[str, Any]:
    d = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    d["slo"] = cfg.slo.model_dump()
    d["setups"] = [asdict(s) for s in cfg.setups]
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def resummarize(out: Path) -> Path:
    """Rewrite SUMMARY.md from a finished run's summary.json in `out` (after a change to the summary code)."""
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(
            f"{saved}: no finished run there to summarize; run `python -m experiments.scaleout --out {out}`"
        )
    summary = json.loads(saved.read_text(encoding="utf-8"))
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))
    return out / "SUMMARY.md"


@click.command("scaleout", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Short prompts, few requests (minutes, for checking the setup).")
@click.option("--requests", "requests_", type=int, default=None, help="Requests per setup (default 32).")
@click.option(
    "--out-dir",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Default bench/results/scaleout (--quick: bench/results/raw/scaleout-quick).",
)
@engines_dir_option
@click.option(
    "--resummarize",
    "resummarize_only",
    is_flag=True,
    help="Measure nothing: rewrite SUMMARY.md from summary.json.",
)
def cli(
    quick: bool, requests_: int | None, out_dir: str | None, engines_dir: Path, resummarize_only: bool
) -> None:
    """`make bench-scaleout`: Dynamo, KV routing vs round-robin (two workers), one worker vs two."""
    cfg = ScaleoutConfig.make(quick=quick, requests=requests_, out_dir=Path(out_dir) if out_dir else None)
    if resummarize_only:
        click.echo(f"rewrote {resummarize(cfg.out_dir)} from summary.json")
        return
    path, summary = run_scaleout(replace(cfg, engines_root=engines_dir))
    click.echo(f"\nwrote {path} (and the reports next to it)")
    for t in summary["targets"]:
        click.echo(f"  {'met    ' if t['met'] else 'NOT met'}  {t['target']}: {t['value']:.2f}")


def main(argv: list[str] | None = None) -> None:
    """Exit codes as kiln's: 0 ok, 1 failure, 2 bad input."""
    run_command(cli, argv, prog_name="python -m experiments.scaleout")


if __name__ == "__main__":
    main()
