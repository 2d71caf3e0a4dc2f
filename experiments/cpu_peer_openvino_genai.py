"""OpenVINO GenAI's continuous-batching pipeline as a peer of llmkiln's CPU engine (the CPU-engine issue, must-have
5), in-process on the same weights and workload: `python -m experiments.cpu_peer_openvino_genai --out DIR`.

Run from the main venv (this module uses llmkiln: the workload, the reports); the pipeline itself runs in the venv
of `bash scripts/openvino_genai_env.sh` (default /tmp/llmkiln-ovgenai/venv, `--venv` or $LLMKILN_OVGENAI_VENV), in
one process per precision: experiments/cpu_peer_openvino_genai_worker.py (no llmkiln imports). Without that venv the
run stops before anything is measured (exit 2, naming the script).

1. The engine: `--engine` (default bench-ov-fp32: the generated bench-llama-125m, fp32 weights), an openvino-cpu
   engine folder or a recipe name, built under `--engines-dir` when missing (`kiln build`). Its IR is what the
   pipeline runs — the same weights as every llmkiln system of the side-by-side run (the IR's precision is chosen
   at load, so the fp32 engine serves both the fp32 and the bf16 runs).
2. The pipeline's model folder (`--model-dir`, default next to the venv: models/<engine name>): the engine's IR,
   configs and tokenizer files linked, plus openvino_tokenizer.xml / openvino_detokenizer.xml converted from the
   engine's tokenizer by openvino-tokenizers (worker `model`).
3. The requests: experiments.cpu_peers' (its CpuPeersConfig gives the sizes, its spec the shared-prefix workload,
   its split_workload the warm-up and per-level slices: one 1500-token system prompt + 80-120 fresh tokens, 32
   output tokens, seed 0; the same --quick, --concurrency, --requests and --warmup give the same requests per level),
   built with the engine's tokenizer, each prompt encoded exactly as llmkiln's server does
   (`Tokenizer.encode(prompt, add_special_tokens=True)`, BOS included) and fed to the pipeline as token ids (no
   tokenizer difference possible). Greedy, EOS ignored, min_new_tokens = max_new_tokens. The ids' sha256 per level
   is in each report's run.extra.
4. Per precision (`--precisions`, default fp32,bf16: INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION f32 / bf16),
   one pipeline: the warm-up (not measured), then the levels (`--concurrency` 1,4,8 with `--requests` 24,32,64, cpu_peers' defaults) in a
   closed loop (worker docstring). Pipeline settings (worker.PipelineSettings): prefix caching on, dynamic split
   fuse (chunked prefill) on, max_num_seqs 8, max_num_batched_tokens 1024, a 4 GB KV cache, 2 threads.

Results (OUT and OUT/raw as experiments.cpu_peers': default bench/results/cpu-peers and
bench/results/raw/cpu-peers): OUT/ovgenai-fp32.json and OUT/ovgenai-bf16.json (BenchReport, schema llmkiln.bench/1,
like cpu_peers' per-system reports: TTFT, ITL, TPOT, throughput per level), their raw per-request records
RAW/ovgenai-*.jsonl (llmkiln.bench.report.save_records), the worker's raw output RAW/ovgenai-*.raw.json (turn it into
a report with `load_peer_report`, into a cpu_peers summary.json entry with `summary_entry`, or rewrite the reports
with `--report-only`). Times are this process's perf_counter_ns, as for
llmkiln.bench.peers' in-process peers: no HTTP/gRPC hop, no streaming cost (the served systems pay both).

`--check`: the correctness check instead of the bench: greedy tokens of ContinuousBatchingPipeline (each prompt
alone, with prefix-cache hits, and all together) and LLMPipeline against llmkiln's runtime (`kiln generate`'s
engine, load_engine) for the same prompt ids: shared-prefix prompts sized to the engine's context plus one text
prompt, `--check-tokens` tokens (default 32). Exit 1 when the pipeline's fp32 tokens differ from an fp32 engine's.
`--quick`: the harness end to end in a few minutes (short prompts, a few requests; the numbers mean nothing).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from experiments.cpu_peer_openvino_genai_worker import PRECISIONS, PipelineSettings
from experiments.cpu_peers import DEFAULT_OUT, CpuPeersConfig, resummarize, split_workload
from experiments.cpu_peers_summary import level_metrics
from llmkiln.bench.report import BenchReport, RunInfo, make_report, print_report, save_records, save_report
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.bench.workloads import BenchRequest, WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import EngineDir, resolve_engine
from llmkiln.errors import BadInput, KilnError

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "experiments" / "cpu_peer_openvino_genai_worker.py"
ENV_SCRIPT = "scripts/openvino_genai_env.sh"
VENV_ENV = "LLMKILN_OVGENAI_VENV"
DEFAULT_VENV = Path("/tmp/llmkiln-ovgenai/venv")
VENV_STAMP = ".llmkiln-ovgenai"  # written by scripts/openvino_genai_env.sh when the install finished
SYSTEM = "openvino-genai"
RECORD_FIELDS = frozenset(RequestRecord.__dataclass_fields__)


def system_name(precision: str) -> str:
    """The report's name: ovgenai-fp32 / ovgenai-bf16 (beside cpu_peers' vllm-fp32 / vllm-bf16)."""
    return f"ovgenai-{precision}"


@dataclass(frozen=True)
class PeerConfig:
    """Sizes of the run: experiments.cpu_peers' (CpuPeersConfig: the same defaults, --quick sizes, options and
    split, so the same arguments give the same requests per level), plus the pipeline's own. The defaults take
    well under a minute per precision on 2 idle cores (bench-llama-125m)."""

    sizes: CpuPeersConfig = field(default_factory=CpuPeersConfig)
    engine: str = "bench-ov-fp32"
    venv: Path | None = None  # None: $LLMKILN_OVGENAI_VENV or /tmp/llmkiln-ovgenai/venv
    model_dir: Path | None = None  # None: <venv>/../models/<engine name>
    precisions: tuple[str, ...] = ("fp32", "bf16")
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    worker_timeout_s: float = 3600.0

    @property
    def out_dir(self) -> Path:
        return Path(self.sizes.out_dir)

    @property
    def raw_dir(self) -> Path:
        return Path(self.sizes.raw_dir)

    @property
    def levels(self) -> tuple[int, ...]:
        return self.sizes.levels

    @property
    def requests(self) -> tuple[int, ...]:
        return self.sizes.requests

    @property
    def warmup(self) -> int:
        return self.sizes.warmup

    @property
    def seed(self) -> int:
        return self.sizes.seed

    @classmethod
    def make(
        cls,
        quick: bool = False,
        out_dir: Path | None = None,
        engine: str | None = None,
        precisions: str | None = None,
        concurrency: str | None = None,
        requests: str | None = None,
        warmup: int | None = None,
        venv: Path | None = None,
        model_dir: Path | None = None,
        settings: dict[str, Any] | None = None,
        user_tokens: str | None = None,
        output_spread: int | None = None,
    ) -> PeerConfig:
        sizes = CpuPeersConfig.make(
            quick=quick,
            out_dir=out_dir,
            concurrency=concurrency,
            requests=requests,
            warmup=warmup,
            user_tokens=user_tokens,
            output_spread=output_spread,
        )
        cfg = cls(sizes=sizes, venv=venv, model_dir=model_dir)
        if engine is not None:
            cfg = replace(cfg, engine=engine)
        if precisions is not None:
            names = tuple(p.strip() for p in precisions.split(",") if p.strip())
            bad = [p for p in names if p not in PRECISIONS]
            if not names or bad or len(set(names)) != len(names):
                raise BadInput(
                    f"--precisions {precisions!r}: give distinct names among {', '.join(PRECISIONS)}, comma-separated"
                )
            cfg = replace(cfg, precisions=names)
        if settings:
            try:
                cfg = replace(cfg, settings=replace(cfg.settings, **settings))
            except TypeError as exc:
                raise BadInput(f"pipeline settings: {exc}") from None
        return cfg

    def spec(self) -> WorkloadSpec:
        return self.sizes.spec()


# ---------------------------------------------------------------------------------------------------------------
# The venv and the engine


def find_venv(venv: Path | None) -> Path:
    """The OpenVINO GenAI venv's python; BadInput (exit 2) naming scripts/openvino_genai_env.sh when it is missing."""
    path = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV)
    python = path / "bin" / "python"
    if not os.access(python, os.X_OK) or not (path / VENV_STAMP).is_file():
        raise BadInput(
            f"no OpenVINO GenAI venv at {path} (or its install did not finish): create it with "
            f"`bash {ENV_SCRIPT} {path}` (openvino-genai, openvino-tokenizers, transformers; about a minute), "
            f"or give another with --venv / ${VENV_ENV}"
        )
    return python


def find_engine(engine: str, engines_root: Path) -> EngineDir:
    """The openvino-cpu engine folder `engine` (a path or a recipe name, built when missing)."""
    try:
        folder = resolve_engine(engine, engines_root)
    except BadInput:
        if Path(engine).name != engine:
            raise
        from llmkiln.backends import build

        folder = EngineDir(build(engine, engines_root).engine_dir)
    if folder.openvino_model() is None or folder.tokenizer_file() is None:
        raise BadInput(
            f"{folder.path}: no openvino_model.xml (+ .bin) or tokenizer.json: the peer runs an openvino-cpu "
            "engine's IR; give one (`kiln build bench-ov-fp32`)"
        )
    return folder


def model_dir_for(cfg: PeerConfig, python: Path, folder: EngineDir) -> Path:
    if cfg.model_dir is not None:
        return Path(cfg.model_dir)
    return python.parents[2] / "models" / folder.path.name  # VENV/bin/python -> VENV/../models/NAME


def _worker(python: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), str(WORKER), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=None,  # the worker's progress lines go straight to our stderr
        text=True,
        timeout=timeout_s,
        check=False,
    )


def prepare_model(python: Path, folder: EngineDir, model_dir: Path) -> dict[str, Any]:
    out = _worker(python, ["model", str(folder.path), str(model_dir)], 600)
    if out.returncode != 0:
        raise KilnError(f"making the pipeline's model folder {model_dir} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# Requests in, reports out


def server_ids(tok: Any, prompt: str) -> list[int]:
    """The prompt's ids as llmkiln's server encodes them (runtime.engine.LLMEngine.encode: BOS included)."""
    return list(tok.encode(prompt, add_special_tokens=True).ids)


def _ids_sha256(ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()


def _request_doc(req: BenchRequest, ids: list[int]) -> dict[str, Any]:
    return {
        "index": req.index,
        "group": req.group,
        "ids": ids,
        "max_tokens": req.max_tokens,
        "num_prompt_tokens": req.num_prompt_tokens,
    }


def requests_doc(cfg: PeerConfig, tok: Any) -> dict[str, Any]:
    """The worker's input: the warm-up and each level's requests as token ids, with the workload's description."""
    wl = build_workload(tok, cfg.spec())
    warm, levels = split_workload(wl, cfg.warmup, cfg.levels, cfg.requests)
    doc: dict[str, Any] = {"workload": wl.describe(), "warmup": [], "levels": {}, "ids_sha256": {}}
    for name, part in [("warmup", warm), *((str(c), w) for c, w in levels.items())]:
        ids = [server_ids(tok, r.prompt) for r in part.requests]
        reqs = [_request_doc(r, i) for r, i in zip(part.requests, ids, strict=True)]
        if name == "warmup":
            doc["warmup"] = reqs
        else:
            doc["levels"][name] = reqs
        doc["ids_sha256"][name] = _ids_sha256(ids)
    return doc


def records_from_raw(level: dict[str, Any]) -> list[RequestRecord]:
    """A level's worker records as RequestRecords (fields RequestRecord lacks, e.g. output_ids, are dropped)."""
    return [RequestRecord(**{k: v for k, v in r.items() if k in RECORD_FIELDS}) for r in level["records"]]


def report_from_raw(raw: dict[str, Any], extra: dict[str, Any] | None = None) -> tuple[BenchReport, dict]:
    """The worker's raw document -> (BenchReport in llmkiln.bench's shape, the records per level)."""
    if raw.get("schema") != "llmkiln.ovgenai-peer/1":
        raise BadInput(f"not an OpenVINO GenAI peer result (schema {raw.get('schema')!r})")
    records = {int(c): records_from_raw(lv) for c, lv in raw["levels"].items()}
    levels = [level_stats(c, recs) for c, recs in sorted(records.items())]
    steps = {
        c: {k: v for k, v in lv.items() if k not in ("records", "next_id")} for c, lv in raw["levels"].items()
    }
    run = RunInfo(
        label=system_name(raw["precision"]),
        system=SYSTEM,
        model=raw.get("model_dir"),
        workload=raw.get("workload") or {},
        mode="warm",
        warmup_requests=int(raw.get("warmup_requests") or 0),
        requests_per_level=max((len(r) for r in records.values()), default=0),
        api="in-process",
        extra={
            "precision": raw["precision"],
            "settings": raw.get("settings"),
            "properties": raw.get("properties"),
            "compiled": raw.get("compiled"),
            "scheduler": raw.get("scheduler"),
            "versions": raw.get("versions"),
            "load_s": raw.get("load_s"),
            "steps": steps,
            "warmup": raw.get("warmup"),
            "ids_sha256": raw.get("ids_sha256"),
            "loadavg_before": raw.get("loadavg_before"),
            "loadavg_after": raw.get("loadavg_after"),
            "timing": "in-process: send = add_request, token = after the pipeline step that produced it "
            "(perf_counter_ns); no transport",
            **(extra or {}),
        },
    )
    return make_report(run, levels, records), records


def summary_entry(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(system name, entry) in the shape of experiments.cpu_peers' summary.json["systems"] entries (levels through
    cpu_peers_summary.level_metrics), for one table with the served systems. Its `kind` is "openvino-genai": the
    summary's FRONT_DOORS needs an entry for it (e.g. "openvino-genai ContinuousBatchingPipeline, in-process")."""
    report, records = report_from_raw(raw)
    entry: dict[str, Any] = {
        "kind": SYSTEM,
        "recipe": None,
        "precision": raw["precision"],
        "engine": raw.get("engine_dir"),
        "api": "in-process",
        "ready_s": raw.get("load_s"),
        "loadavg_before": raw.get("loadavg_before"),
        "loadavg_after": raw.get("loadavg_after"),
        "compiled": raw.get("compiled"),
        "settings": raw.get("settings"),
        "levels": {str(lv.concurrency): level_metrics(lv, records[lv.concurrency]) for lv in report.levels},
    }
    return system_name(raw["precision"]), entry


def load_peer_report(path: str | Path) -> BenchReport:
    """The loader for the summary table: a worker's raw JSON (OUT/raw/ovgenai-*.raw.json) -> BenchReport."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such file; run `python -m experiments.cpu_peer_openvino_genai` first")
    return report_from_raw(json.loads(p.read_text()))[0]


def write_reports(cfg: PeerConfig, precision: str, raw: dict[str, Any], console: Console) -> BenchReport:
    report, records = report_from_raw(raw)
    name = system_name(precision)
    save_report(report, cfg.out_dir / f"{name}.json")
    save_records(records, cfg.raw_dir / f"{name}.jsonl")
    print_report(report, console)
    return report


# ---------------------------------------------------------------------------------------------------------------
# The runs


def run_peer(cfg: PeerConfig, engines_root: Path, console: Console) -> dict[str, BenchReport]:
    python = find_venv(cfg.venv)  # before anything is built or measured
    folder = find_engine(cfg.engine, engines_root)
    tok = load_tokenizer(folder.path)
    model_dir = model_dir_for(cfg, python, folder)
    stamp = prepare_model(python, folder, model_dir)
    console.print(f"pipeline model folder {model_dir} (engine {folder.path})")
    cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    req_path = cfg.raw_dir / "ovgenai-requests.json"
    doc = requests_doc(cfg, tok)
    req_path.write_text(json.dumps(doc) + "\n")
    reports: dict[str, BenchReport] = {}
    failed = []
    for precision in cfg.precisions:
        raw_path = cfg.raw_dir / f"{system_name(precision)}.raw.json"
        console.rule(f"{system_name(precision)}: load average {[round(x, 2) for x in os.getloadavg()]}")
        t0 = time.monotonic()
        args = ["bench", str(model_dir), str(req_path), str(raw_path), "--precision", precision]
        out = _worker(python, [*args, "--settings", json.dumps(asdict(cfg.settings))], cfg.worker_timeout_s)
        if out.returncode != 0 or not raw_path.is_file():
            console.print(f"[red]{system_name(precision)}: the worker failed (exit {out.returncode})[/red]")
            failed.append(precision)
            continue
        raw = json.loads(raw_path.read_text())
        raw.update(model_dir=str(model_dir), engine_dir=str(folder.path), model_stamp=stamp)
        raw["wall_s"] = time.monotonic() - t0
        raw_path.write_text(json.dumps(raw) + "\n")
        reports[precision] = write_reports(cfg, precision, raw, console)
    if failed:
        raise KilnError(f"the OpenVINO GenAI worker failed for {', '.join(failed)} (its stderr is above)")
    return reports


def check_prompts(folder: EngineDir, seed: int = 0) -> list[list[int]]:
    """Prompt ids for the correctness check: 4 shared-prefix prompts sized to the engine's context (the second to
    fourth hit the pipeline's prefix cache when run one after the other) and one text prompt."""
    tok = load_tokenizer(folder.path)
    context = folder.recipe().limits.max_seq_len
    system = max(32, min(1500, context // 2 - 64))
    user = (max(4, system // 16), max(8, system // 8))
    spec = WorkloadSpec(
        name="shared-prefix",
        num_requests=4,
        seed=seed,
        output_tokens=32,
        system_tokens=system,
        user_tokens=user,
    )
    wl = build_workload(tok, spec)
    return [server_ids(tok, r.prompt) for r in wl.requests] + [server_ids(tok, "Once upon a time")]


def llmkiln_tokens(folder: EngineDir, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy tokens from llmkiln's runtime on the engine (what `kiln generate` runs), one prompt at a time."""
    from llmkiln.runtime.loader import load_engine
    from llmkiln.runtime.request import SamplingParams

    runtime = load_engine(folder).start()
    try:
        out = []
        for ids in prompts:
            handle = runtime.submit(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for _ in handle:
                pass
            out.append(handle.output_ids)
        return out
    finally:
        runtime.shutdown()


def _agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(ref, got, strict=True))
    firsts = []
    for a, b in zip(ref, got, strict=True):
        firsts.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None))
    return {"identical": same, "of": len(ref), "first_divergence": firsts}


def run_check(cfg: PeerConfig, engines_root: Path, max_tokens: int, console: Console) -> dict[str, Any]:
    python = find_venv(cfg.venv)
    folder = find_engine(cfg.engine, engines_root)
    model_dir = model_dir_for(cfg, python, folder)
    prepare_model(python, folder, model_dir)
    prompts = check_prompts(folder, cfg.seed)
    engine_precision = folder.recipe().precision
    ref = llmkiln_tokens(folder, prompts, max_tokens)
    result: dict[str, Any] = {
        "engine": str(folder.path),
        "engine_precision": engine_precision,
        "prompt_lengths": [len(p) for p in prompts],
        "max_tokens": max_tokens,
        "llmkiln": ref,
        "precisions": {},
    }
    cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    ids_path = cfg.raw_dir / "ovgenai-check-ids.json"
    ids_path.write_text(json.dumps({"prompts": prompts, "max_tokens": max_tokens}) + "\n")
    bad = []
    for precision in cfg.precisions:
        out_path = cfg.raw_dir / f"ovgenai-check-{precision}.json"
        out = _worker(
            python,
            [
                "tokens",
                str(model_dir),
                str(ids_path),
                str(out_path),
                "--precision",
                precision,
                "--settings",
                json.dumps(asdict(cfg.settings)),
            ],
            cfg.worker_timeout_s,
        )
        if out.returncode != 0:
            raise KilnError(f"the OpenVINO GenAI worker failed for {precision} (exit {out.returncode})")
        got = json.loads(out_path.read_text())
        entry = {
            k: _agreement(ref, got[k])
            for k in ("continuous_batching_alone", "continuous_batching_together", "llm_pipeline")
        }
        entry["compiled"] = got.get("compiled")
        result["precisions"][precision] = entry
        console.print(
            f"{precision} vs llmkiln {engine_precision} ({len(prompts)} prompts, {max_tokens} tokens): "
            + ", ".join(
                f"{k}: {v['identical']}/{v['of']} identical" for k, v in entry.items() if k != "compiled"
            )
        )
        if precision == engine_precision == "fp32" and any(
            v["identical"] != v["of"] for k, v in entry.items() if k != "compiled"
        ):
            bad.append(precision)
    (cfg.out_dir).mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / f"ovgenai-check-{folder.path.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    if bad:
        raise KilnError(f"OpenVINO GenAI's fp32 greedy tokens differ from llmkiln's on {folder.path}")
    return result


def add_to_summary(cfg: PeerConfig, console: Console) -> Path | None:
    """Put this peer's systems into the cpu-peers run in the same folder (OUT/summary.json, when there is one)
    and re-render its SUMMARY.md: one table with the served systems."""
    saved = cfg.out_dir / "summary.json"
    if not saved.is_file():
        return None
    summary = json.loads(saved.read_text(encoding="utf-8"))
    for precision in cfg.precisions:
        raw_path = cfg.raw_dir / f"{system_name(precision)}.raw.json"
        if raw_path.is_file():
            name, entry = summary_entry(json.loads(raw_path.read_text()))
            summary.setdefault("systems", {})[name] = entry
    saved.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    md = resummarize(cfg.out_dir)
    console.print(f"added to {saved}; {md} rewritten")
    return md


def rewrite_reports(cfg: PeerConfig, console: Console) -> dict[str, BenchReport]:
    out = {}
    for precision in cfg.precisions:
        raw_path = cfg.raw_dir / f"{system_name(precision)}.raw.json"
        if raw_path.is_file():
            out[precision] = write_reports(cfg, precision, json.loads(raw_path.read_text()), console)
    if not out:
        raise BadInput(f"--report-only: no {cfg.raw_dir}/ovgenai-*.raw.json: run the experiment first")
    return out


@click.command(name="cpu_peer_openvino_genai", help=__doc__.split("\n\n")[0])
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Results folder [default: {DEFAULT_OUT}; --quick: bench/results/raw/cpu-peers-quick].",
)
@click.option(
    "--quick", is_flag=True, help="The harness end to end in minutes (short prompts, a few requests)."
)
@click.option(
    "--engine", default=None, help="openvino-cpu engine folder or recipe name [default: bench-ov-fp32]."
)
@click.option("--precisions", default=None, help="fp32 and/or bf16, comma-separated [default: fp32,bf16].")
@click.option("--concurrency", default=None, help="Closed-loop levels [default: 1,4,8].")
@click.option(
    "--requests", default=None, help="Requests per level, one or one per level [default: 24,32,64]."
)
@click.option("--warmup", type=int, default=None, help="Warm-up requests, not measured [default: 8].")
@click.option(
    "--user-tokens", default=None, help="Fresh tokens per request after the system prompt [default: 80-120]."
)
@click.option(
    "--output-spread", type=int, default=None, help="Output tokens 32 ± this per request [default: 0]."
)
@click.option("--threads", type=int, default=None, help="INFERENCE_NUM_THREADS [default: 2].")
@click.option(
    "--max-num-batched-tokens", type=int, default=None, help="A step's token budget [default: 1024]."
)
@click.option("--max-num-seqs", type=int, default=None, help="Sequences per step [default: 8].")
@click.option("--cache-gb", type=int, default=None, help="KV cache size in GB [default: 4].")
@click.option(
    "--venv",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"The venv of {ENV_SCRIPT} [default: ${VENV_ENV} or {DEFAULT_VENV}].",
)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The pipeline's model folder (made from the engine) [default: VENV/../models/ENGINE].",
)
@click.option("--check", is_flag=True, help="Greedy tokens against llmkiln's runtime instead of the bench.")
@click.option(
    "--check-tokens", type=int, default=32, show_default=True, help="Tokens per prompt for --check."
)
@click.option("--report-only", is_flag=True, help="Measure nothing: rewrite the reports from OUT/raw.")
@engines_dir_option
def cli(
    out_dir: Path | None,
    quick: bool,
    engine: str | None,
    precisions: str | None,
    concurrency: str | None,
    requests: str | None,
    warmup: int | None,
    user_tokens: str | None,
    output_spread: int | None,
    threads: int | None,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    cache_gb: int | None,
    venv: Path | None,
    model_dir: Path | None,
    check: bool,
    check_tokens: int,
    report_only: bool,
    engines_dir: Path,
) -> None:
    settings = {
        k: v
        for k, v in (
            ("threads", threads),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_num_seqs", max_num_seqs),
            ("cache_size_gb", cache_gb),
        )
        if v is not None
    }
    cfg = PeerConfig.make(
        quick,
        out_dir,
        engine,
        precisions,
        concurrency,
        requests,
        warmup,
        venv,
        model_dir,
        settings,
        user_tokens,
        output_spread,
    )
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    if report_only:
        rewrite_reports(cfg, console)
        add_to_summary(cfg, console)
    elif check:
        run_check(cfg, engines_dir, check_tokens, console)
    else:
        run_peer(cfg, engines_dir, console)
        add_to_summary(cfg, console)


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, "python -m experiments.cpu_peer_openvino_genai")


if __name__ == "__main__":
    main()
