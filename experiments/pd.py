"""The prefill/decode experiment (`make bench-pd` = `python -m experiments.pd --out bench/results/pd`):
aggregated Dynamo workers vs one prefill + one decode worker on the same cores, KV moved by NIXL.

Engine bench-optimized (bench-llama-125m, fp32 KV), served by `kiln serve --dynamo` on loopback through the OpenAI
completions endpoint (prompt lengths exact), greedy, every setup a fresh launch with the same requests:
- `agg-2w`: two aggregated workers (one core each), KV router;
- `pd-1p1d`: one prefill worker and one decode worker (one core each), KV router for the prefill tier;
- `pd-1p1d-chunk128`: the same with 128-token prefill chunks on the prefill worker (it runs no decodes: smaller
  chunks only bound how long a short prompt waits there behind a long one);
- `pd-1p1d-local128`: pd-1p1d-chunk128 plus conditional disaggregation by length: a prompt whose uncached part is
  at most 128 tokens (`--max-local-prefill-tokens`, the default) skips the prefill tier and is prefilled on the
  decode worker (the other pd setups set it to 0: every prompt through the prefill tier);
- `pd-decode-first`: pd-1p1d-local128 with `--decode-first`: the decode worker on both cores (onnxruntime threads
  that do not spin), the prefill worker's compute at idle priority (runtime.compute_priority).
The default runs agg-2w, pd-1p1d, pd-1p1d-local128 and pd-decode-first; `--setups` picks others
(`pd-1p1d-chunk128`; `pd-1p1d-cond`: Dynamo's own conditional disaggregation in the frontend, isl_bounding).
Workloads: mixed-long-short (2048-token prompts among 32-128-token ones, one long every `long_every`) and
shared-prefix (system prompts of `system_tokens` tokens plus a user turn). Each workload runs closed loop at
concurrency 4 and 8 and open loop (Poisson arrivals at `request_rate`). Per run: TTFT and ITL p50/p95/p99 for the
short and the long requests (shared-prefix: all requests), output tok/s, and for pd the KV transfer per import
(bytes and seconds from the decode worker's llmkiln_kv_transfer_* counters) and the fallbacks.

Before measuring, each launch gets one short and one long request (not measured: the first shapes, the first KV
transfer's UCX connection). Then the transfer probe (pd only, idle system): `probe_requests` 2048-token prompts one at a time; each one's
transfer time (decode worker counters) against its prefill time (the prefill worker's TTFT histogram): the
target is transfer ≤ 10% of prefill. Results: OUT/summary.json and SUMMARY.md, raw records under
bench/results/raw/pd/. `--quick` checks the harness in minutes (short prompts, few requests).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from llmkiln.backends import build
from llmkiln.bench.report import save_records, write_atomic
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.bench.stats import RequestRecord, summarize
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.dynamo.cluster import available_cores
from llmkiln.dynamo.launcher import DynamoLauncher
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions


@dataclass(frozen=True)
class Setup:
    name: str
    workers: int = 0  # aggregated workers
    prefill: int = 0
    decode: int = 0
    # Dynamo's conditional disaggregation (the frontend's isl_bounding policy, eff_isl_threshold): prompts
    # whose uncached part is at most this many tokens may be prefilled on the decode worker; 0: off
    local_prefill_below: int = 0
    prefill_chunk: int = 0  # the prefill workers' scheduler.max_prefill_tokens (0: the recipe's)
    # llmkiln's conditional disaggregation: prompts whose uncached part is at most this many tokens are prefilled
    # on the decode worker (--max-local-prefill-tokens; 0: every prompt through the prefill tier)
    max_local_prefill: int = 0
    threads: int = 0  # intra-op threads of every worker (0: cores // workers); 2 on 2 cores: tiers share both
    # --decode-first: the decode worker on every core, the prefill worker's compute at idle priority; False:
    # --no-decode-first (equal core shares); None: kiln serve's choice from the cores (on for 2 cores)
    decode_first: bool | None = False

    def frontend_args(self) -> tuple[str, ...]:
        if not self.local_prefill_below:
            return ()
        # Dynamo's isl_bounding (defaults: eff_isl_ratio_threshold 0.7): measured, a prompt goes to the decode worker
        # when its uncached part is short AND the decode worker holds most of it (a fully uncached short prompt
        # still goes to the prefill tier, even with the ratio at 1.0)
        config = {"policy": "isl_bounding", "eff_isl_threshold": self.local_prefill_below}
        return ("--router-conditional-disagg", "--router-conditional-disagg-config", json.dumps(config))


AVAILABLE = (
    Setup("agg-2w", workers=2),
    Setup("pd-1p1d", prefill=1, decode=1),
    # a prefill tier runs no decodes: smaller chunks there only bound how long a short prompt waits behind a long
    Setup("pd-1p1d-chunk128", prefill=1, decode=1, prefill_chunk=128),
    Setup("pd-1p1d-local128", prefill=1, decode=1, prefill_chunk=128, max_local_prefill=128),
    Setup("pd-1p1d-cond", prefill=1, decode=1, local_prefill_below=512),
    # both workers may use both cores (oversubscribed when both are busy): the decode worker's short prefills and
    # decodes get the prefill worker's idle core
    Setup("pd-1p1d-local128-t2", prefill=1, decode=1, prefill_chunk=128, max_local_prefill=128, threads=2),
    # local128 with the decode tier first: it runs on both cores (threads that do not spin), the prefill worker's
    # compute at idle priority on the cycles the decode worker, the frontend and the client leave
    Setup(
        "pd-decode-first", prefill=1, decode=1, prefill_chunk=128, max_local_prefill=128, decode_first=True
    ),
    # what `kiln serve ENGINE --dynamo --prefill-workers 1 --decode-workers 1` launches: local128 (the
    # --max-local-prefill-tokens default), the recipe's prefill chunks, the decode tier first where each worker's
    # core share is at most 2 cores (llmkiln.dynamo.cluster.decode_first_choice)
    Setup("pd-default", prefill=1, decode=1, max_local_prefill=128, decode_first=None),
)
SETUPS = tuple(s for s in AVAILABLE if s.name in ("agg-2w", "pd-1p1d-local128", "pd-default"))


@dataclass(frozen=True)
class PdConfig:
    """Sizes (defaults: the committed run, about 30 minutes on 2 idle cores: 128 requests per level, so the short
    requests' p95 of a mixed level stands on ~96 samples)."""

    out_dir: Path = Path("bench/results/pd")
    raw_dir: Path = Path("bench/results/raw/pd")
    engines_root: Path | None = None
    recipe: str = "bench-optimized"
    seed: int = 0
    output_tokens: int = 32
    long_tokens: int = 2048
    short_tokens: tuple[int, int] = (32, 128)
    long_every: int = 4
    system_tokens: int = 1024
    system_prompts: int = 2
    user_tokens: tuple[int, int] = (32, 96)
    concurrency: tuple[int, ...] = (4, 8)
    requests: int = 128  # per closed-loop level (>= 128: the short class alone has ~96, enough for its p95)
    open_requests: int = 128
    request_rate: float = 1.0
    probe_requests: int = 3
    setups: tuple[Setup, ...] = SETUPS
    workloads: tuple[str, ...] = ("mixed-long-short", "shared-prefix")
    timeout_s: float = 900.0

    @classmethod
    def make(cls, quick: bool = False, out_dir: Path | None = None, requests: int | None = None) -> PdConfig:
        cfg = cls()
        if quick:
            cfg = replace(
                cfg,
                long_tokens=512,
                short_tokens=(16, 32),
                system_tokens=256,
                output_tokens=8,
                requests=8,
                open_requests=8,
                request_rate=2.0,
                probe_requests=2,
                out_dir=Path("bench/results/raw/pd-quick"),
                raw_dir=Path("bench/results/raw/pd-quick/raw"),
            )
        if requests is not None:
            cfg = cfg.with_requests(requests)
        if out_dir is not None:
            cfg = replace(cfg, out_dir=Path(out_dir))
        return cfg

    def with_requests(self, requests: int) -> PdConfig:
        """`requests` per level, closed and open loop."""
        if requests < max(self.concurrency, default=1):
            raise BadInput(
                f"--requests must be at least the largest concurrency ({max(self.concurrency, default=1)})"
            )
        return replace(self, requests=requests, open_requests=requests)

    def spec(self, workload: str, n: int) -> WorkloadSpec:
        return WorkloadSpec(
            name=workload,
            num_requests=n,
            seed=self.seed,
            output_tokens=self.output_tokens,
            long_tokens=self.long_tokens,
            short_tokens=self.short_tokens,
            long_every=self.long_every,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            num_system_prompts=self.system_prompts,
        )


def _dist(values: list[float]) -> dict[str, float | None]:
    d = summarize(values)
    return {"p50": d.p50, "p95": d.p95, "p99": d.p99, "n": d.count}


def _classes(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    ok = [r for r in records if r.ok]
    groups = {"long": [r for r in ok if r.group == "long"], "short": [r for r in ok if r.group == "short"]}
    out = {k: v for k, v in groups.items() if v}
    out["all"] = ok
    return out


def run_summary(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requests": len(records),
        "errors": sum(1 for r in records if not r.ok),
        "output_tok_s": sum(r.num_output_tokens for r in records if r.ok) / wall_s if wall_s > 0 else None,
        "wall_s": round(wall_s, 2),
    }
    for name, rs in _classes(records).items():
        out[name] = {
            "ttft_ms": _dist([r.ttft_ms for r in rs if r.ttft_ms is not None]),
            "itl_ms": _dist([x for r in rs for x in r.itl_ms()]),
            "cached_tokens_mean": (sum(r.num_cached_tokens or 0 for r in rs) / len(rs)) if rs else None,
        }
    return out


def _kv(m: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    def d(k: str) -> float:
        return m.get(k, 0.0) - b.get(k, 0.0)

    n = d("kv_transfer_imports_total")
    return {
        "imports": n,
        "fallbacks": d("kv_transfer_fallbacks_total"),
        "local_prefills": d("kv_transfer_local_prefills_total"),
        "local_prefill_tokens": d("kv_transfer_local_prefill_tokens_total"),
        "bytes_per_request": d("kv_transfer_import_bytes_total") / n if n else 0.0,
        "ms_per_request": 1e3 * d("kv_transfer_import_seconds_total") / n if n else 0.0,
        "read_ms_per_request": 1e3 * d("kv_transfer_import_read_seconds_total") / n if n else 0.0,
    }


def _measure(
    cfg: PdConfig,
    launcher: DynamoLauncher,
    setup: Setup,
    model: str,
    workload: Workload,
    name: str,
    rate: float | None,
    concurrency: int,
    n: int,
) -> dict[str, Any]:
    decode_idx = setup.prefill  # the first decode worker
    workers = range(launcher.spec.workers)
    start = [launcher.worker_metrics(i) for i in workers]
    before = start[decode_idx] if setup.decode else {}
    t_wall = time.time_ns()
    bench = BenchConfig(
        url=launcher.url,
        model=model,
        workload=workload,
        concurrency=(concurrency,),
        requests_per_level=n,
        label=name,
        timeout_s=cfg.timeout_s,
        api="completions",
        request_rate=rate,
        seed=cfg.seed,
        progress=False,
    )
    t0 = time.perf_counter()
    _report, records = run_bench(bench)
    wall = time.perf_counter() - t0
    recs = [r for level in records.values() for r in level]
    save_records(records, cfg.raw_dir / f"{name}.jsonl")
    out = run_summary(recs, wall)
    end = [launcher.worker_metrics(i) for i in workers]
    out["prompt_tokens_per_worker"] = [
        e["prompt_tokens_total"] - b["prompt_tokens_total"] for b, e in zip(start, end, strict=True)
    ]
    # where the TTFT goes: each worker's own arrival -> first token, mean over its requests of the run (a
    # prefill worker: queue + prefill; a decode worker: queue + block load + the last partial block)
    out["server_ttft_ms_per_worker"] = [
        (e["ttft_ms_sum"] - b["ttft_ms_sum"]) / max(1.0, e["ttft_ms_count"] - b["ttft_ms_count"])
        for b, e in zip(start, end, strict=True)
    ]
    if setup.decode:
        out["kv_transfer"] = _kv(end[decode_idx], before)
    out["window_ns"] = [t_wall, time.time_ns()]  # for the step profile, read once the launch is stopped
    return out


def step_stats(path: Path, window: list[int]) -> dict[str, Any] | None:
    """One worker's engine steps that started in `window` (time.time_ns() from, to; its step profile): decode-only
    steps and steps with a prefill (ms), the largest step and prefix load, and the prompt tokens it computed
    itself (prompt less cached, from its request records), in all and the most for one request. None without a
    profile."""
    if not path.is_file():
        return None
    steps, computed = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if rec.get("kind") == "step" and window[0] <= rec.get("t", 0) <= window[1]:
            steps.append(rec)
        elif rec.get("kind") == "request" and window[0] <= (rec.get("arrival") or 0) <= window[1]:
            computed.append(int(rec.get("prompt") or 0) - int(rec.get("cached") or 0))
    decode = [s["total_us"] / 1e3 for s in steps if s.get("decode") and not s.get("prefill")]
    prefill = [s["total_us"] / 1e3 for s in steps if s.get("prefill")]
    return {
        "steps": len(steps),
        "decode_only_ms": _dist(decode),
        "with_prefill_ms": _dist(prefill),
        "max_step_ms": max((s["total_us"] / 1e3 for s in steps), default=None),
        "max_load_ms": max((s.get("load_us", 0) / 1e3 for s in steps), default=None),
        "computed_tokens": sum(computed),
        "max_computed_tokens": max(computed, default=0),
    }


def _probe(
    cfg: PdConfig, launcher: DynamoLauncher, setup: Setup, model: str, workload: Workload
) -> dict[str, Any]:
    """Long prompts one at a time: transfer time vs the prefill worker's prefill (its TTFT) for each."""
    rows = []
    for i, req in enumerate(workload.requests[: cfg.probe_requests]):
        b_dec, b_pre = launcher.worker_metrics(setup.prefill), launcher.worker_metrics(0)
        one = replace(workload, requests=[replace(req, index=0)])
        bench = BenchConfig(
            url=launcher.url,
            model=model,
            workload=one,
            concurrency=(1,),
            requests_per_level=1,
            label=f"probe-{i}",
            timeout_s=cfg.timeout_s,
            api="completions",
            progress=False,
        )
        run_bench(bench)
        m_dec, m_pre = launcher.worker_metrics(setup.prefill), launcher.worker_metrics(0)
        kv = _kv(m_dec, b_dec)
        prefill_ms = m_pre["ttft_ms_sum"] - b_pre["ttft_ms_sum"]
        rows.append(
            {
                "prompt_tokens": req.num_prompt_tokens,
                "prefill_ms": prefill_ms,
                "transfer_ms": kv["ms_per_request"],
                "read_ms": kv["read_ms_per_request"],
                "transfer_bytes": kv["bytes_per_request"],
                "ratio": kv["ms_per_request"] / prefill_ms if prefill_ms else None,
            }
        )
    return {"rows": rows, "max_ratio": max((r["ratio"] or 0) for r in rows) if rows else None}


def _run_setup(
    cfg: PdConfig,
    setup: Setup,
    engine: Path,
    workloads: dict[str, list[Workload]],
    probe: Workload,
    console: Console,
    warm: Workload | None = None,
) -> dict[str, Any]:
    opts = DynamoOptions(
        workers=setup.workers or 2,
        prefill_workers=setup.prefill,
        decode_workers=setup.decode,
        grace_period_s=1.0,
        frontend_args=setup.frontend_args(),
        prefill_overrides={"scheduler": {"max_prefill_tokens": setup.prefill_chunk}}
        if setup.prefill_chunk
        else {},
        # the KV transfer options apply to prefill/decode setups only (the options refuse them elsewhere)
        kv=KvTransferOptions(max_local_prefill_tokens=setup.max_local_prefill)
        if setup.prefill
        else KvTransferOptions(),
        threads_per_worker=setup.threads,
        decode_first=setup.decode_first if setup.prefill else None,
        profile_dir=cfg.raw_dir / "profiles" / setup.name,  # the step profile (a few list appends per step)
    )
    shutil.rmtree(cfg.raw_dir / "profiles" / setup.name, ignore_errors=True)
    model = EngineDir(engine).recipe().serve.model_name
    with serve_dynamo_engine(engine, opts) as launcher:
        spec = launcher.spec
        result: dict[str, Any] = {
            "setup": asdict(setup),
            "threads_per_worker": [spec.worker_threads(i) for i in range(spec.workers)],
            "decode_first": spec.decode_first if setup.prefill else None,
            "decode_first_why": spec.decode_first_why if setup.prefill else None,
            "runs": {},
        }
        if (
            warm is not None and warm.requests
        ):  # not measured: first shapes, the first KV transfer's UCX connection
            n = len(warm.requests)
            run_bench(
                BenchConfig(
                    url=launcher.url,
                    model=model,
                    workload=warm,
                    concurrency=(1,),
                    requests_per_level=n,
                    label=f"{setup.name}-warm",
                    timeout_s=cfg.timeout_s,
                    api="completions",
                    progress=False,
                )
            )
        for wname, parts in workloads.items():
            for (kind, conc, rate), wl in zip(_levels(cfg), parts, strict=True):
                name = f"{setup.name}-{wname}-{kind}{conc if rate is None else ''}"
                console.log(f"{name}: {len(wl.requests)} requests")
                n = len(wl.requests)
                result["runs"][f"{wname}/{kind}{conc if rate is None else ''}"] = _measure(
                    cfg, launcher, setup, model, wl, name, rate, conc, n
                )
        if setup.decode and cfg.probe_requests:
            result["probe"] = _probe(cfg, launcher, setup, model, probe)
    if spec.profile_dir is not None:  # stopped: every worker's profile is written out
        for run in result["runs"].values():
            window = run.pop("window_ns")
            run["steps_per_worker"] = [step_stats(spec.profile_path(i), window) for i in range(spec.workers)]
    return result


def _levels(cfg: PdConfig) -> list[tuple[str, int, float | None]]:
    levels: list[tuple[str, int, float | None]] = [("c", c, None) for c in cfg.concurrency]
    if cfg.open_requests:
        levels.append(("open", cfg.open_requests, cfg.request_rate))
    return levels


def _split(cfg: PdConfig, tok: Any, wname: str) -> list[Workload]:
    sizes = [cfg.requests for _ in cfg.concurrency] + ([cfg.open_requests] if cfg.open_requests else [])
    wl = build_workload(tok, cfg.spec(wname, sum(sizes)))
    parts, at = [], 0
    for n in sizes:
        parts.append(
            replace(wl, requests=[replace(r, index=i) for i, r in enumerate(wl.requests[at : at + n])])
        )
        at += n
    return parts


def run_pd(cfg: PdConfig, console: Console | None = None) -> tuple[Path, dict[str, Any]]:
    console = console or Console()
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    engine = build(cfg.recipe, cfg.engines_root).engine_dir
    tok = load_tokenizer(engine)
    workloads = {w: _split(cfg, tok, w) for w in cfg.workloads}
    longs = build_workload(
        tok, replace(cfg.spec("mixed-long-short", cfg.long_every * cfg.probe_requests + 1), seed=cfg.seed + 1)
    )
    probe = replace(longs, requests=[r for r in longs.requests if r.group == "long"])
    others = build_workload(tok, replace(cfg.spec("mixed-long-short", cfg.long_every), seed=cfg.seed + 2))
    first = {r.group: r for r in reversed(others.requests)}  # one short and one long request
    warm = replace(others, requests=[replace(r, index=i) for i, r in enumerate(first.values())])
    results = {}
    for setup in cfg.setups:
        console.rule(setup.name)
        results[setup.name] = _run_setup(cfg, setup, engine, workloads, probe, console, warm)
    summary = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "engine": str(engine),
        "cores": available_cores(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "setups": results,
    }
    summary["targets"] = targets(summary)
    out = Path(cfg.out_dir)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))
    return out / "SUMMARY.md", summary


def _get(summary: dict[str, Any], setup: str, run: str, cls: str, metric: str, q: str) -> float | None:
    try:
        return summary["setups"][setup]["runs"][run][cls][metric][q]
    except (KeyError, TypeError):
        return None


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per pd setup against agg-2w, mixed-long-short at every level: decode ITL p99 <= 0.5x and short-request
    TTFT p95 no worse; and a long prompt's transfer <= 10% of its prefill (the probe)."""
    out: list[dict[str, Any]] = []
    setups = summary["setups"]
    if "agg-2w" not in setups:
        return out
    for pd in (s for s in setups if s.startswith("pd-")):
        for run in setups[pd]["runs"]:
            if not run.startswith("mixed-long-short"):
                continue
            for cls in ("all", "short", "long"):
                a = _get(summary, "agg-2w", run, cls, "itl_ms", "p99")
                p = _get(summary, pd, run, cls, "itl_ms", "p99")
                if a and p is not None:
                    out.append(
                        {
                            "target": f"{pd} {run} {cls}: ITL p99 / agg <= 0.5",
                            "value": p / a,
                            "met": p / a <= 0.5,
                        }
                    )
            a = _get(summary, "agg-2w", run, "short", "ttft_ms", "p95")
            p = _get(summary, pd, run, "short", "ttft_ms", "p95")
            if a and p is not None:
                out.append(
                    {
                        "target": f"{pd} {run} short: TTFT p95 / agg <= 1.0",
                        "value": p / a,
                        "met": p / a <= 1.0,
                    }
                )
        probe = setups[pd].get("probe")
        if probe and probe["max_ratio"] is not None:
            out.append(
                {
                    "target": f"{pd}: transfer / prefill of a long prompt <= 0.10",
                    "value": probe["max_ratio"],
                    "met": probe["max_ratio"] <= 0.10,
                }
            )
    return out


def _f(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def _levels_text(cfg: dict[str, Any]) -> str:
    closed = (
        f"Closed loop at concurrency {', '.join(map(str, cfg['concurrency']))} ({cfg['requests']} requests each)"
        if cfg["concurrency"]
        else "No closed loop"
    )
    if not cfg["open_requests"]:
        return f"{closed}; no open loop."
    return f"{closed}, open loop at {cfg['request_rate']:g} req/s ({cfg['open_requests']} requests)."


def summary_markdown(summary: dict[str, Any]) -> str:
    cfg, setups = summary["config"], summary["setups"]
    lines = [
        "# bench-pd: prefill/decode separation (NIXL KV transfer) vs aggregated workers",
        "",
        f"Engine `{cfg['recipe']}` (bench-llama-125m, fp32 KV) under `kiln serve --dynamo` on loopback, OpenAI "
        f"completions, greedy, {cfg['output_tokens']} output tokens. mixed-long-short: {cfg['long_tokens']}-token "
        f"prompts, one in {cfg['long_every']}, among {cfg['short_tokens'][0]}-{cfg['short_tokens'][1]}-token ones; "
        f"shared-prefix: {cfg['system_prompts']} system prompts of {cfg['system_tokens']} tokens + "
        f"{cfg['user_tokens'][0]}-{cfg['user_tokens'][1]}-token user turns. {_levels_text(cfg)}",
        f"Machine: {summary['cores']} cores, load average {summary['loadavg_start']} at the start, "
        f"{summary['loadavg_end']} at the end; whole run {summary['wall_s'] / 60:.1f} min.",
        "",
        "| run | setup | class | TTFT p50 | p95 | p99 ms | ITL p50 | p95 | p99 ms | out tok/s | KV/import | "
        "transfer ms/import (read) | imports / local prefills | fallbacks | prompt tokens per worker | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    runs = sorted({r for s in setups.values() for r in s["runs"]})
    for run in runs:
        for sname, s in setups.items():
            r = s["runs"].get(run)
            if r is None:
                continue
            kv = r.get("kv_transfer")
            for cls in ("short", "long", "all"):
                if cls not in r:
                    continue
                c = r[cls]
                lines.append(
                    f"| {run} | {sname} | {cls} | {_f(c['ttft_ms']['p50'])} | {_f(c['ttft_ms']['p95'])} | "
                    f"{_f(c['ttft_ms']['p99'])} | {_f(c['itl_ms']['p50'], '.1f')} | {_f(c['itl_ms']['p95'], '.1f')} | "
                    f"{_f(c['itl_ms']['p99'], '.1f')} | {_f(r['output_tok_s'], '.1f')} | "
                    f"{(_f(kv['bytes_per_request'] / 2**20, '.1f') + ' MiB') if kv else '-'} | "
                    f"{(_f(kv['ms_per_request'], '.1f') + ' (' + _f(kv.get('read_ms_per_request'), '.1f') + ')') if kv else '-'} | "
                    f"{(str(int(kv['imports'])) + ' / ' + str(int(kv.get('local_prefills', 0)))) if kv else '-'} | "
                    f"{int(kv['fallbacks']) if kv else '-'} | "
                    f"{' / '.join(str(int(t)) for t in r.get('prompt_tokens_per_worker', []))} | {r['errors']} |"
                )
    probes = [(n, s["probe"]) for n, s in setups.items() if s.get("probe")]
    if probes:
        lines += [
            "",
            "## Transfer probe (one long prompt at a time, idle workers)",
            "",
            "| setup | prompt tokens | prefill ms (prefill worker TTFT) | transfer ms (NIXL read) | KV MiB | "
            "transfer / prefill |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for sname, probe in probes:
            for row in probe["rows"]:
                lines.append(
                    f"| {sname} | {row['prompt_tokens']} | {_f(row['prefill_ms'])} | {_f(row['transfer_ms'], '.1f')} "
                    f"({_f(row.get('read_ms'), '.1f')}) | "
                    f"{row['transfer_bytes'] / 2**20:.1f} | {_f(row['ratio'], '.3f')} |"
                )
    lines += [
        "",
        "## Where the TTFT goes (mean server-side TTFT per worker: its own arrival to first token, ms)",
        "",
        "| run | " + " | ".join(setups) + " |",
        "|---|" + "---|" * len(setups),
    ]
    for run in runs:
        cells = []
        for s in setups.values():
            per = s["runs"].get(run, {}).get("server_ttft_ms_per_worker")
            cells.append(" / ".join(f"{v:.0f}" for v in per) if per else "-")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    step_rows = []
    for run in runs:
        for sname, s in setups.items():
            r = s["runs"].get(run) or {}
            per = r.get("steps_per_worker")
            if not per or not sname.startswith("pd-"):
                continue
            d = per[s["setup"]["prefill"]]  # the first decode worker
            if not d:
                continue
            dec, pre = d["decode_only_ms"], d["with_prefill_ms"]
            step_rows.append(
                f"| {run} | {sname} | {_f(dec['p50'], '.1f')} / {_f(dec['p99'], '.1f')} | {pre['n']} | "
                f"{_f(pre['p50'], '.1f')} / {_f(pre['p99'], '.1f')} | {_f(d['max_step_ms'])} | "
                f"{_f(d['max_load_ms'], '.1f')} | {d['computed_tokens']} ({d['max_computed_tokens']}) |"
            )
    if step_rows:
        lines += [
            "",
            "## The decode worker's steps (its step profile, $LLMKILN_PROFILE)",
            "",
            "| run | setup | decode-only step p50 / p99 ms | steps with a prefill | their p50 / p99 ms | largest step ms "
            "| largest prefix load ms | prompt tokens it computed (most for one request) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *step_rows,
        ]
    lines += ["", "## Targets", ""]
    for t in summary["targets"]:
        lines.append(f"- {'met' if t['met'] else 'NOT met'}: {t['target']} (measured {t['value']:.2f})")
    lines += [
        "",
        "Reproduce: `make bench-pd` (= `python -m experiments.pd --out bench/results/pd`); "
        "`python -m experiments.pd --quick` checks the harness.",
        "",
    ]
    return "\n".join(lines)


def resummarize(out: Path) -> Path:
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(
            f"{saved}: no finished run there to summarize; run `python -m experiments.pd --out {out}`"
        )
    summary = json.loads(saved.read_text(encoding="utf-8"))
    summary["targets"] = targets(summary)
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))
    return out / "SUMMARY.md"


@click.command("pd", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--quick", is_flag=True, help="Short prompts, few requests (minutes, for checking the harness)."
)
@click.option(
    "--requests", "requests_", type=int, default=None, help="Requests per level (default 128; --quick 8)."
)
@click.option(
    "--out-dir",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Default bench/results/pd (--quick: bench/results/raw/pd-quick).",
)
@click.option(
    "--setups",
    "setup_names",
    default=None,
    help=f"Comma-separated setups (default {','.join(s.name for s in SETUPS)}; all: "
    f"{','.join(s.name for s in AVAILABLE)}).",
)
@click.option(
    "--workloads",
    "workload_names",
    default=None,
    help="Comma-separated workloads (default mixed-long-short,shared-prefix).",
)
@click.option(
    "--concurrency",
    "concurrency_",
    default=None,
    help="Closed-loop levels, comma-separated (default 4,8); 'none': the open loop only.",
)
@click.option(
    "--request-rate", type=float, default=None, help="The open loop's Poisson rate, requests/s (default 1)."
)
@click.option("--no-open", is_flag=True, help="Closed-loop levels only (no open loop).")
@engines_dir_option
@click.option("--resummarize", "resummarize_only", is_flag=True, help="Rewrite SUMMARY.md from summary.json.")
def cli(
    quick: bool,
    requests_: int | None,
    out_dir: str | None,
    setup_names: str | None,
    workload_names: str | None,
    concurrency_: str | None,
    request_rate: float | None,
    no_open: bool,
    engines_dir: Path,
    resummarize_only: bool,
) -> None:
    """`make bench-pd`: aggregated workers vs one prefill + one decode worker (NIXL KV transfer)."""
    cfg = PdConfig.make(quick=quick, out_dir=Path(out_dir) if out_dir else None)
    if concurrency_ is not None:
        try:
            levels = () if concurrency_ == "none" else tuple(int(c) for c in concurrency_.split(","))
        except ValueError:
            raise BadInput(f"--concurrency {concurrency_!r}: comma-separated integers, or none") from None
        if any(c < 1 for c in levels):
            raise BadInput(f"--concurrency {concurrency_!r}: levels must be at least 1")
        cfg = replace(cfg, concurrency=levels)
    if request_rate is not None:
        if not request_rate > 0:
            raise BadInput(f"--request-rate must be positive, got {request_rate}")
        cfg = replace(cfg, request_rate=request_rate)
    if requests_ is not None:
        cfg = cfg.with_requests(requests_)
    if no_open:
        cfg = replace(cfg, open_requests=0)
    if not cfg.concurrency and not cfg.open_requests:
        raise BadInput("--concurrency none --no-open: nothing to run")
    if setup_names:
        by_name = {s.name: s for s in AVAILABLE}
        unknown = [n for n in setup_names.split(",") if n not in by_name]
        if unknown:
            raise BadInput(f"--setups {','.join(unknown)}: choose among {', '.join(by_name)}")
        cfg = replace(cfg, setups=tuple(by_name[n] for n in setup_names.split(",")))
    if workload_names:
        names = tuple(n for n in workload_names.split(",") if n)
        bad = [n for n in names if n not in ("mixed-long-short", "shared-prefix")]
        if bad or not names:
            raise BadInput(f"--workloads {workload_names!r}: choose among mixed-long-short, shared-prefix")
        cfg = replace(cfg, workloads=names)
    if resummarize_only:
        click.echo(f"rewrote {resummarize(cfg.out_dir)} from summary.json")
        return
    path, summary = run_pd(replace(cfg, engines_root=engines_dir))
    click.echo(f"\nwrote {path}")
    for t in summary["targets"]:
        click.echo(f"  {'met    ' if t['met'] else 'NOT met'}  {t['target']}: {t['value']:.2f}")


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="python -m experiments.pd")


if __name__ == "__main__":
    main()
