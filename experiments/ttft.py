"""The TTFT experiment (`make bench-ttft` = `python -m experiments.ttft --out bench/results`): same weights,
lower TTFT.

One engine (bench-llama-125m, fp32, 4096 context) and two recipes that differ only in runtime settings:
bench-baseline (no prefix reuse, no chunked prefill, static batching) and bench-optimized (prefix reuse, chunked
prefill, in-flight batching, TTFT-first scheduling). Each is served by tritonserver on free loopback ports and
measured with the same seeded workloads: shared-prefix over the concurrency sweep (every request fresh: no
prompt repeats an earlier one), unique and mixed-long-short at one level; the optimized server runs with the
runtime's step profile on (its reports carry per-level profiles). Then, in the same run: the suffix-only
prefill floor of the shared-prefix c=1 requests (llmkiln.bench.floor), the TTFT vs TPOT trade-off of the
TTFT-first scheduler over `tpot_slo_ms` settings (experiments.tradeoff), and the peers (onnxruntime-genai
og.Engine and og.Generator, transformers) on the shared-prefix requests of the side level, in-process on the
same ONNX file / source weights. Results go to OUT_DIR: one JSON report per (system, workload), raw per-request
JSONL under OUT_DIR/raw/ (git-ignored), PNG plots, summary.json and SUMMARY.md (experiments.ttft_summary: the
targets). `--resummarize` measures nothing and rewrites the summary from the saved reports.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click
from rich.console import Console
from tokenizers import Tokenizer

from experiments.tradeoff import TradeoffPoint, run_tradeoff
from experiments.ttft_summary import Extras, summarize_experiment
from llmkiln.backends import build
from llmkiln.bench.floor import FloorMeter, FloorResult
from llmkiln.bench.peers import PEERS, run_peer
from llmkiln.bench.profile import profile_levels
from llmkiln.bench.report import (
    BenchReport,
    load_report,
    print_report,
    save_records,
    save_report,
    write_atomic,
)
from llmkiln.bench.runner import BenchConfig, level_slices, requests_needed, run_bench
from llmkiln.bench.serving import serve_engine
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.runtime.profile import PROFILE_ENV

WORKLOAD_NAMES = ("shared-prefix", "unique", "mixed-long-short")


@dataclass
class ExperimentConfig:
    """Sizes of the experiment. The defaults take ≈ 30 minutes on 2 idle cores."""

    out_dir: Path = Path("bench/results")
    engines_root: Path | None = None  # None: $LLMKILN_ENGINES or ./engines
    baseline: str = "bench-baseline"
    optimized: str = "bench-optimized"
    seed: int = 0
    levels: tuple[int, ...] = (1, 4, 8, 16)
    # per shared-prefix level (at least the level's concurrency). A closed loop starts with a burst of c requests
    # that all arrive at once: with 32 at c=8 the burst is a quarter of the samples and decides the p95; 64 make
    # the p95 mostly steady state (the burst's own tail is reported, not hidden: see docs/bench.md)
    requests: int = 64
    peer_requests: int = 32  # the peers take the first ones of llmkiln's c=8 requests (minutes each)
    warmup: int = 2  # per workload and server, not measured (primes the prefix cache: warm mode)
    side_concurrency: int = 8  # unique, mixed-long-short and the peers run at this level
    side_requests: int = 16  # unique requests; mixed-long-short gets twice as many
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (80, 120)
    output_tokens: int = 32
    prompt_tokens: tuple[int, int] = (1550, 1700)
    long_tokens: int = 2048
    short_tokens: tuple[int, int] = (32, 128)
    long_every: int = 8
    peers: tuple[str, ...] = PEERS
    workloads: tuple[str, ...] = WORKLOAD_NAMES
    floor: bool = True  # the suffix-only prefill floor of the shared-prefix c=1 requests
    # TTFT vs TPOT: the optimized engine served with each setting (None = decode-first), fresh requests
    tradeoff_slos: tuple[float | None, ...] = (None, 50.0, 100.0, 200.0, 400.0)
    tradeoff_levels: tuple[int, ...] = (4, 8, 16)
    tradeoff_requests: int = 32  # per setting and level: two waves at c=16
    timeout_s: float = 900.0
    quick: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        quick: bool = False,
        requests: int | None = None,
        out_dir: Path | None = None,
        peers: bool = True,
        only: tuple[str, ...] = (),
        tradeoff: bool = True,
    ) -> ExperimentConfig:
        cfg = cls()
        if quick:
            # Minutes on a busy machine: shorter prompts, fewer levels and requests. Same code paths.
            cfg = replace(
                cfg,
                quick=True,
                levels=(1, 4),
                requests=4,
                warmup=1,
                side_concurrency=4,
                side_requests=4,
                system_tokens=512,
                user_tokens=(16, 64),
                output_tokens=16,
                prompt_tokens=(528, 576),
                long_tokens=1024,
                short_tokens=(16, 64),
                long_every=4,
                tradeoff_slos=(None, 100.0),
                tradeoff_levels=(4,),
                tradeoff_requests=4,
                out_dir=Path("bench/results/raw/quick"),  # git-ignored: a check, not a result
            )
        if requests is not None:
            if requests <= 0:
                raise BadInput(f"--requests must be positive, got {requests}")
            cfg = replace(cfg, requests=requests, side_requests=requests)
        if out_dir is not None and not (quick and out_dir == Path("bench/results")):
            cfg = replace(cfg, out_dir=Path(out_dir))
        if not peers:
            cfg = replace(cfg, peers=())
        if not tradeoff:
            cfg = replace(cfg, tradeoff_slos=())
        if only:
            cfg = replace(cfg, workloads=tuple(w for w in WORKLOAD_NAMES if w in only))
        return cfg

    def spec(self, name: str) -> tuple[WorkloadSpec, tuple[int, ...], int]:
        """(workload spec, concurrency levels, requests per level) of one workload."""
        if name == "shared-prefix":
            levels, per = self.levels, self.requests
        elif name == "unique":
            levels, per = (self.side_concurrency,), self.side_requests
        else:
            levels, per = (self.side_concurrency,), 2 * self.side_requests
        n = requests_needed(per, levels, self.warmup)
        spec = WorkloadSpec(
            name=name,
            num_requests=n,
            seed=self.seed,
            output_tokens=self.output_tokens,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            prompt_tokens=self.prompt_tokens,
            long_tokens=self.long_tokens,
            short_tokens=self.short_tokens,
            long_every=self.long_every,
        )
        return spec, levels, per


def _build(recipe: str, engines_root: Path | None) -> Path:
    return build(recipe, engines_root).engine_dir


def run_experiment(cfg: ExperimentConfig, console: Console | None = None) -> tuple[Path, dict]:
    """Run everything, write the results; returns the SUMMARY.md path and the summary."""
    console = console or Console()
    t_start = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)
    out = Path(cfg.out_dir)
    engines = {r: _build(r, cfg.engines_root) for r in (cfg.baseline, cfg.optimized)}
    tok = load_tokenizer(engines[cfg.baseline])
    workloads = {}
    for name in cfg.workloads:
        spec, levels, per = cfg.spec(name)
        workloads[name] = (build_workload(tok, spec), levels, per)

    reports: dict[str, dict[str, BenchReport]] = {}
    extras = Extras()
    for recipe, engine_dir in engines.items():
        meter = None
        if recipe == cfg.optimized and cfg.floor and "shared-prefix" in workloads:
            # the suffix-only prefill floor, measured between the c=1 requests (llmkiln.bench.floor)
            meter = FloorMeter(engine_dir, workloads["shared-prefix"][0].requests)
        try:
            reports[recipe] = _serve_and_bench(cfg, recipe, engine_dir, workloads, out, console, meter)
        finally:
            if meter is not None:
                meter.close()
        if meter is not None and meter.times:
            extras.floor = meter.result()
            console.print(_floor_line(extras.floor))
            write_atomic(out / cfg.optimized / "floor.json", extras.floor.model_dump_json(indent=2) + "\n")
    if cfg.tradeoff_slos and "shared-prefix" in workloads:
        extras.tradeoff = _tradeoff(cfg, tok, engines[cfg.optimized], out, console)

    peer_reports: dict[str, BenchReport] = {}
    if cfg.peers and "shared-prefix" in workloads:
        wl, levels, per = workloads["shared-prefix"]
        c = cfg.side_concurrency
        if c not in levels:
            c = max(levels)
        slice_c = level_slices(wl, levels, per, cfg.warmup)[c][: cfg.peer_requests]
        model_dir = _source_dir(engines[cfg.baseline])
        for peer in cfg.peers:
            console.rule(f"peer {peer}: shared-prefix c={c}, {len(slice_c)} requests")
            try:
                rep = run_peer(peer, engines[cfg.baseline], model_dir, wl, slice_c, c)
            except Exception as exc:  # a broken peer must not lose llmkiln's results
                console.print(f"[red]peer {peer} failed: {type(exc).__name__}: {exc}[/red]")
                continue
            print_report(rep, console)
            save_report(rep, out / "peers" / f"{peer}.json")
            peer_reports[peer] = rep

    cfg_dump = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    cfg_dump["wall_s"] = time.perf_counter() - t_start
    cfg_dump["loadavg_start"] = load_start
    summary, markdown = summarize_experiment(
        cfg_dump, cfg.baseline, cfg.optimized, reports, peer_reports, out, extras
    )
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", markdown)
    return out / "SUMMARY.md", summary


def resummarize(out: Path) -> tuple[Path, dict]:
    """Rewrite SUMMARY.md, summary.json and the plots from a finished run's saved reports in `out` (after a
    change to the summary code): nothing is measured; the run's config and machine come from its summary.json."""
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(
            f"{saved}: no finished run there to summarize; run `python -m experiments.ttft --out {out}`"
        )
    old = json.loads(saved.read_text(encoding="utf-8"))
    cfg, machine = old["config"], old["machine"]
    baseline, optimized = cfg["baseline"], cfg["optimized"]
    reports: dict[str, dict[str, BenchReport]] = {}
    for recipe in (baseline, optimized):
        reports[recipe] = {
            name: load_report(out / recipe / f"{name}.json")
            for name in cfg["workloads"]
            if (out / recipe / f"{name}.json").is_file()
        }
    peers = {
        p: load_report(out / "peers" / f"{p}.json")
        for p in cfg["peers"]
        if (out / "peers" / f"{p}.json").is_file()
    }
    extras = Extras()
    if (out / optimized / "floor.json").is_file():
        extras.floor = FloorResult.model_validate_json(
            (out / optimized / "floor.json").read_text(encoding="utf-8")
        )
    if (out / optimized / "tradeoff.json").is_file():
        points = json.loads((out / optimized / "tradeoff.json").read_text(encoding="utf-8"))
        extras.tradeoff = [TradeoffPoint.model_validate(p) for p in points]
    summary, markdown = summarize_experiment(cfg, baseline, optimized, reports, peers, out, extras, machine)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", markdown)
    return out / "SUMMARY.md", summary


def _serve_and_bench(
    cfg: ExperimentConfig,
    recipe: str,
    engine_dir: Path,
    workloads: dict[str, tuple[Workload, tuple[int, ...], int]],
    out: Path,
    console: Console,
    meter: FloorMeter | None = None,
) -> dict[str, BenchReport]:
    """One server for the recipe, every workload against it; the optimized one runs with the step profile on.
    `meter` times each shared-prefix c=1 request's suffix-only prefill right after it was served."""
    reports: dict[str, BenchReport] = {}
    records: dict[str, dict[int, list[RequestRecord]]] = {}
    profile = out / "raw" / f"{recipe}-profile.jsonl"
    env = {}
    if recipe == cfg.optimized:
        profile.parent.mkdir(parents=True, exist_ok=True)
        profile.unlink(missing_ok=True)
        env = {PROFILE_ENV: str(profile.resolve())}
    console.rule(f"{recipe}: serving {engine_dir}")
    with serve_engine(engine_dir, env=env) as served:
        console.print(f"ready in {served.ready_s:.1f} s at {served.url}")
        for name, (wl, levels, per) in workloads.items():
            bench = BenchConfig(
                url=served.url,
                model=served.model,
                workload=wl,
                concurrency=levels,
                requests_per_level=per,
                warmup_requests=cfg.warmup,
                label=recipe,
                timeout_s=cfg.timeout_s,
                extra={"recipe": recipe, "engine_dir": str(engine_dir), "server_ready_s": served.ready_s},
            )
            if meter is not None and name == "shared-prefix":
                bench.on_record = lambda c, rec, m=meter: m.measure(rec) if c == 1 else None
            report, recs = run_bench(bench)
            print_report(report, console)
            save_records(recs, out / "raw" / f"{recipe}-{name}.jsonl")
            reports[name], records[name] = report, recs
    for name, report in reports.items():
        if env:  # the server has stopped: its profile file is complete
            report.profile = profile_levels(records[name], profile)
        save_report(report, out / recipe / f"{name}.json")
    return reports


def _tradeoff(
    cfg: ExperimentConfig, tok: Tokenizer, engine_dir: Path, out: Path, console: Console
) -> list[TradeoffPoint]:
    spec, _, _ = cfg.spec("shared-prefix")
    per_setting = requests_needed(cfg.tradeoff_requests, cfg.tradeoff_levels, cfg.warmup)
    # fresh user turns (another seed) after the same system prompt; one slice per setting
    spec = replace(spec, seed=cfg.seed + 1, num_requests=per_setting * len(cfg.tradeoff_slos))
    wl = build_workload(tok, spec)
    console.rule(f"TTFT vs TPOT: {cfg.optimized}, settings {cfg.tradeoff_slos}, c={cfg.tradeoff_levels}")
    points, reps = run_tradeoff(
        engine_dir,
        wl,
        cfg.tradeoff_slos,
        cfg.tradeoff_levels,
        cfg.tradeoff_requests,
        cfg.warmup,
        cfg.timeout_s,
    )
    for slo, rep in zip(cfg.tradeoff_slos, reps.values(), strict=True):
        print_report(rep, console)
        save_report(
            rep, out / "tradeoff" / ("decode-first.json" if slo is None else f"tpot-slo-{slo:g}ms.json")
        )
    write_atomic(
        out / cfg.optimized / "tradeoff.json",
        json.dumps([p.model_dump() for p in points], indent=2) + "\n",
    )
    return points


def _floor_line(f: FloorResult) -> str:
    if f.prefill_ms.p50 is None or f.ttft_ms.p50 is None or f.ratio_p50 is None:
        return f"suffix-only prefill floor: no successful c=1 requests ({f.requests})"
    return (
        f"suffix-only prefill floor p50 {f.prefill_ms.p50:.1f} ms ({f.suffix_tokens.p50:.0f} tokens on "
        f"{f.cached_tokens.p50:.0f} cached); served TTFT p50 {f.ttft_ms.p50:.1f} ms = {f.ratio_p50:.2f}x the floor"
    )


def _source_dir(engine_dir: Path) -> Path | None:
    """The source checkpoint recorded in the engine manifest (for the transformers peer)."""
    manifest = EngineDir(engine_dir).manifest()
    if manifest is None:
        return None
    p = Path(manifest.source.path)
    return p if p.is_dir() else None


@click.command("ttft", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A few requests per level (minutes, for checking the setup).")
@click.option(
    "--requests", "requests_", type=int, default=None, help="Requests per level (overrides the default)."
)
@click.option(
    "--out-dir",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="bench/results",
    show_default=True,
)
@engines_dir_option
@click.option("--no-peers", is_flag=True, help="Skip onnxruntime-genai and transformers.")
@click.option("--no-tradeoff", is_flag=True, help="Skip the TTFT vs TPOT sweep over scheduler.tpot_slo_ms.")
@click.option(
    "--only",
    type=click.Choice(WORKLOAD_NAMES),
    multiple=True,
    help="Run only these workloads (repeatable).",
)
@click.option(
    "--resummarize",
    "resummarize_only",
    is_flag=True,
    help="Measure nothing: rewrite SUMMARY.md, summary.json and the plots from the saved reports in --out.",
)
def cli(
    quick: bool,
    requests_: int | None,
    out_dir: str,
    engines_dir: Path,
    no_peers: bool,
    no_tradeoff: bool,
    only: tuple[str, ...],
    resummarize_only: bool,
) -> None:
    """`make bench-ttft`: baseline vs optimized recipe on one engine, each served by tritonserver.

    \b
    python -m experiments.ttft --out bench/results            (the committed run, ≈ 30 minutes)
    python -m experiments.ttft --quick                        (results under bench/results/raw/quick)
    python -m experiments.ttft --resummarize --out bench/results
    """
    if resummarize_only:
        path, summary = resummarize(Path(out_dir))
        click.echo(f"rewrote {path} from the saved reports")
        print_targets(summary)
        return
    cfg = ExperimentConfig.make(
        quick=quick,
        requests=requests_,
        out_dir=Path(out_dir),
        peers=not no_peers,
        only=only,
        tradeoff=not no_tradeoff,
    )
    path, summary = run_experiment(replace(cfg, engines_root=engines_dir))
    click.echo(f"\nwrote {path} (and the reports and plots next to it)")
    print_targets(summary)


def print_targets(summary: dict) -> None:
    for t in summary["targets"]:
        what = f"{t['workload']} c={t['concurrency']} {t.get('peer', '')} {t['metric']} {t.get('stat', '')}".replace(
            "  ", " "
        )
        value = t.get("change", t.get("ratio", t.get("value")))
        if value is None:
            shown = "n/a"
        elif "change" in t:
            shown = f"{value * 100:+.1f}%"
        elif "ratio" in t or t["metric"] == "ttft_over_floor":
            shown = f"{value:.2f}x"
        else:
            shown = f"{value:.1f}"
        click.echo(f"  {'met    ' if t['met'] else 'NOT met'}  {what}: {shown} (limit {t['limit']})")


def main(argv: list[str] | None = None) -> None:
    """Exit codes as kiln's: 0 ok, 1 failure, 2 bad input."""
    run_command(cli, argv, prog_name="python -m experiments.ttft")


if __name__ == "__main__":
    main()
