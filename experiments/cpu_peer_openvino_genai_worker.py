"""OpenVINO GenAI's ContinuousBatchingPipeline measured in-process: the worker of experiments/cpu_peer_openvino_genai.py,
run by the venv of scripts/openvino_genai_env.sh (openvino-genai has no OpenAI server on PyPI). Standard library,
numpy and openvino-genai only: no llmkiln import, so the venv needs none of llmkiln's dependencies; the prompts
arrive as token ids in a JSON file the main venv wrote, the results leave as plain JSON records.

    VENV/bin/python experiments/cpu_peer_openvino_genai_worker.py model ENGINE_DIR MODEL_DIR
    VENV/bin/python experiments/cpu_peer_openvino_genai_worker.py bench MODEL_DIR REQUESTS.json OUT.json \
        --precision fp32 --settings '{"max_num_batched_tokens": 1024, ...}'
    VENV/bin/python experiments/cpu_peer_openvino_genai_worker.py tokens MODEL_DIR IDS.json OUT.json --precision fp32

- `model`: the pipeline's model folder from an llmkiln openvino-cpu engine folder: the engine's IR
  (openvino_model.xml/.bin), config.json, generation_config.json and tokenizer files as absolute symlinks (the
  engine's files as built, nothing re-exported), plus openvino_tokenizer.xml / openvino_detokenizer.xml converted by
  openvino-tokenizers from the engine's tokenizer (transformers' AutoTokenizer on its tokenizer.json,
  with_detokenizer). A stamp (the engine's manifest.json sha256 and the openvino-tokenizers version) skips the
  conversion when nothing changed.
- `bench`: one pipeline in one precision; the warm-up requests (closed loop at the highest concurrency, not
  measured: the shared prefix lands in the prefix cache), then each level's requests in a closed loop of
  `concurrency` clients. One thread drives the pipeline as OpenVINO's own server does: `add_request` (token ids, so
  no tokenizer difference), `step()`, and after every step each live handle's new tokens (`read()`), stamped with
  time.perf_counter_ns() — the time the token is available to the caller; a finished request is replaced by the next
  one at once (closed loop). Records carry RequestRecord's fields (llmkiln.bench.stats) as plain JSON.
- `tokens`: greedy tokens for given prompt ids from ContinuousBatchingPipeline and from LLMPipeline (the
  correctness check against llmkiln's runtime).

Prompt-lookup decoding (experiments/spec_decode.py): settings `prompt_lookup_tokens` K > 0 builds the pipeline
with the property `prompt_lookup=True` (GenAI's PromptLookupImpl: n-gram candidates from the prompt and the output,
verified by the main model in the same step) and gives every request GenerationConfig `num_assistant_tokens=K`,
`max_ngram_size=prompt_lookup_ngram`. A request doc's `ignore_eos: false` (default true, the peer's setting) stops
at EOS and the request's `stop_token_ids` instead of generating exactly max_tokens. Each record also carries
`step_tokens`: the tokens each step gave it (1 per step without speculation; 1 + accepted drafts with it), and
`request_id` (the pipeline's). GenAI reports no acceptance through its Python API (PromptLookupImpl keeps its
SpeculativeDecodingMetrics internal; get_metrics() is PipelineMetrics, EncodedGenerationResult.extended_perf_metrics
is None); it prints them to stdout whenever it runs out of requests: with prompt lookup the bench captures fd 1
around each level and gives every record its `acceptance_rates` (parse_acceptance_rates: % per verifying step).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ENV_SCRIPT = "scripts/openvino_genai_env.sh"
SCHEMA = "llmkiln.ovgenai-peer/1"
PRECISIONS = {"fp32": "f32", "bf16": "bf16"}  # llmkiln's precision name -> OpenVINO's element type
# The engine folder's files the pipeline reads (linked, not copied: the IR is the engine's own).
MODEL_FILES = (
    "openvino_model.xml",
    "openvino_model.bin",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
STAMP = "llmkiln-ovgenai.json"
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class PipelineSettings:
    """The pipeline's settings, comparable to llmkiln's bench recipe and to vLLM's flags in the CPU-engine issue.

    - enable_prefix_caching: KV blocks of finished requests stay cached and later prompts with the same prefix
      reuse them (vLLM --enable-prefix-caching; llmkiln's prefix store).
    - dynamic_split_fuse: chunked prefill: a step schedules the running sequences' decode tokens first, then
      fills the rest of its token budget with prompt chunks (vLLM --enable-chunked-prefill; llmkiln's mixed
      steps). With it off, OpenVINO GenAI's "vLLM" scheduler runs whole prompts in steps of their own.
    - max_num_seqs: at most this many sequences per step. NOTE: OpenVINO GenAI enforces it only in its
      non-split-fuse scheduler (scheduler.hpp, `_schedule_prompt_phase_vllm`); with dynamic_split_fuse the token
      budget and the KV blocks bound a step. The closed loop never has more than `concurrency` (<= 8) requests in
      flight, so 8 is what it would be anyway.
    - max_num_batched_tokens: the token budget of one step (decode tokens + prompt chunks; vLLM
      --max-num-batched-tokens 1024).
    - cache_size_gb: the KV cache's size in GB (vLLM VLLM_CPU_KVCACHE_SPACE=4).
    - threads: INFERENCE_NUM_THREADS (the CPU plugin's compute threads; 2 = the machine's cores).
    - prompt_lookup_tokens: 0 = plain decoding; K > 0 = prompt-lookup decoding (property prompt_lookup=True,
      GenerationConfig num_assistant_tokens=K); prompt_lookup_ngram: its max_ngram_size.
    KV cache precision = inference precision (KV_CACHE_PRECISION; the CPU plugin's default would be u8).
    """

    enable_prefix_caching: bool = True
    dynamic_split_fuse: bool = True
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 1024
    cache_size_gb: int = 4
    threads: int = 2
    prompt_lookup_tokens: int = 0
    prompt_lookup_ngram: int = 3

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown pipeline settings {unknown}; known: {sorted(known)}")
        return cls(**d)

    def scheduler_fields(self) -> dict[str, Any]:
        """SchedulerConfig's attributes (cache_size in GB)."""
        return {
            "enable_prefix_caching": self.enable_prefix_caching,
            "dynamic_split_fuse": self.dynamic_split_fuse,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "cache_size": self.cache_size_gb,
        }

    def properties(self, precision: str) -> dict[str, Any]:
        """The CPU plugin's properties for `precision` (fp32 or bf16)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        ov_type = PRECISIONS[precision]
        props: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": ov_type,
            "KV_CACHE_PRECISION": ov_type,
            "INFERENCE_NUM_THREADS": self.threads,
        }
        if self.prompt_lookup_tokens > 0:
            props["prompt_lookup"] = True  # ContinuousBatchingPipeline -> PromptLookupImpl
        return props


def scheduler_config(og: Any, settings: PipelineSettings) -> Any:
    """An og.SchedulerConfig with `settings` (og: the openvino_genai module, or a stand-in in tests)."""
    sc = og.SchedulerConfig()
    for name, value in settings.scheduler_fields().items():
        setattr(sc, name, value)
    return sc


def _import_genai() -> Any:
    try:
        import openvino_genai as og  # type: ignore[import-not-found]
    except ImportError as exc:
        print(
            f"error: openvino_genai is not importable by {sys.executable} ({exc}); run this worker with the venv of "
            f"`bash {ENV_SCRIPT}` (it prints that venv's python)",
            file=sys.stderr,
        )
        sys.exit(EXIT_BAD_INPUT)
    return og


# ---------------------------------------------------------------------------------------------------------------
# The model folder


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_model_dir(engine_dir: Path, model_dir: Path) -> dict[str, Any]:
    """The pipeline's model folder from an openvino-cpu engine folder (see the module docstring); its stamp."""
    from importlib import metadata

    engine_dir = engine_dir.resolve()
    if not (engine_dir / "openvino_model.xml").is_file() or not (engine_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{engine_dir}: no openvino_model.xml or tokenizer.json: give an openvino-cpu engine folder "
            "(`kiln build bench-ov-fp32`)"
        )
    manifest = engine_dir / "manifest.json"
    stamp = {
        "engine_dir": str(engine_dir),
        "manifest_sha256": _sha256(manifest)
        if manifest.is_file()
        else _sha256(engine_dir / "openvino_model.xml"),
        "openvino_tokenizers": metadata.version("openvino-tokenizers"),
    }
    stamp_path = model_dir / STAMP
    if stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return stamp
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        link, target = model_dir / name, engine_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if target.is_file():
            link.symlink_to(target)
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer  # type: ignore[import-not-found]
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="ovgenai-tok-") as staging:
        hf = AutoTokenizer.from_pretrained(str(_byte_level_tokenizer_dir(engine_dir, Path(staging))))
        tokenizer, detokenizer = convert_tokenizer(hf, with_detokenizer=True)
    ov.save_model(tokenizer, str(model_dir / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(model_dir / "openvino_detokenizer.xml"))
    stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def _byte_level_tokenizer_dir(engine_dir: Path, staging: Path) -> Path:
    """The folder to read the tokenizer from: the engine's, or — for a byte-level BPE whose tokenizer.json decodes
    through a SentencePiece-style chain (ByteFallback, Fuse, Replace '\u2581', ByteLevel), as transformers 5.14's
    GGUF loader writes for SmolLM2 — a copy whose decoder is the plain ByteLevel one and whose byte_fallback is off.
    openvino-tokenizers cannot build a detokenizer for that chain ("FuzeRagged ... index '2' out of range"); the
    vocabulary has no <0x..> byte tokens and no token text holds '\u2581', so the two decoders give the same text
    and the ids are untouched (the peer gets ids; --check compares its greedy tokens with llmkiln's)."""
    path = engine_dir / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    decoder = data.get("decoder") or {}
    steps = [d.get("type") for d in decoder.get("decoders", [])] if decoder.get("type") == "Sequence" else []
    if "ByteLevel" not in steps or "ByteFallback" not in steps:
        return engine_dir
    vocab = data.get("model", {}).get("vocab", {})
    if any(t.startswith("<0x") or "\u2581" in t for t in vocab):
        return engine_dir  # a real byte-fallback vocabulary: leave it to openvino-tokenizers
    data["decoder"] = next(d for d in decoder["decoders"] if d.get("type") == "ByteLevel")
    data["model"]["byte_fallback"] = False
    for name in os.listdir(engine_dir):
        if name.startswith("tokenizer") or name in (
            "special_tokens_map.json",
            "chat_template.jinja",
            "config.json",
        ):
            if name != "tokenizer.json":
                shutil.copyfile(engine_dir / name, staging / name)
    (staging / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return staging


# ---------------------------------------------------------------------------------------------------------------
# The closed loop


@dataclass(frozen=True)
class PeerRequest:
    """One request as the main venv wrote it: the prompt's token ids (BOS included, as llmkiln's server encodes)."""

    index: int
    group: str
    ids: tuple[int, ...]
    max_tokens: int
    num_prompt_tokens: int  # content tokens as the workload counted them (RequestRecord.num_prompt_tokens)
    ignore_eos: bool = True  # True: exactly max_tokens tokens (the peer); False: stop at EOS / stop_token_ids
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PeerRequest:
        return cls(
            int(d["index"]),
            str(d["group"]),
            tuple(int(t) for t in d["ids"]),
            int(d["max_tokens"]),
            int(d["num_prompt_tokens"]),
            bool(d.get("ignore_eos", True)),
            tuple(int(t) for t in d.get("stop_token_ids", ())),
        )


def new_record(req: PeerRequest, send_ns: int) -> dict[str, Any]:
    """A RequestRecord (llmkiln.bench.stats) as a plain dict."""
    return {
        "index": req.index,
        "group": req.group,
        "send_ns": send_ns,
        "token_ns": [],
        "send_wall_ns": time.time_ns(),
        "end_ns": None,
        "num_prompt_tokens": req.num_prompt_tokens,
        "num_output_tokens": 0,
        "num_cached_tokens": None,  # the pipeline does not report per-request prefix hits
        "server": {},
        "error": None,
        "output_ids": [],  # not a RequestRecord field: the tokens themselves (dropped by the loader)
        "step_tokens": [],  # not a RequestRecord field: tokens per step that gave this request any
    }


def read_tokens(handle: Any) -> list[int]:
    """The tokens a GenerationHandle has for its reader since the last read (a step's worth, or none)."""
    ids: list[int] = []
    while handle.can_read():
        for out in handle.read().values():
            ids.extend(int(t) for t in out.generated_ids)
    return ids


def closed_loop(
    pipe: Any,
    requests: Sequence[PeerRequest],
    concurrency: int,
    make_input: Callable[[PeerRequest], Any],
    make_config: Callable[[PeerRequest], Any],
    first_id: int = 0,
    clock: Callable[[], int] = time.perf_counter_ns,
    running: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`requests` through `pipe` (a ContinuousBatchingPipeline) with at most `concurrency` in flight; a finished
    request's client sends the next one at once. Returns the records (in request order) and step statistics.

    `running`: the handle status meaning "not finished" (og.GenerationStatus.RUNNING); None: any status whose name
    is RUNNING.
    """
    queue = list(requests)
    live: dict[int, tuple[Any, dict[str, Any], PeerRequest]] = {}
    done: list[dict[str, Any]] = []
    next_id = first_id
    steps: list[int] = []
    batch: list[int] = []

    def submit() -> None:
        nonlocal next_id
        req = queue.pop(0)
        rec = new_record(req, clock())
        try:
            handle = pipe.add_request(next_id, make_input(req), make_config(req))
        except Exception as exc:  # a refused request is reported, not raised
            rec["error"] = f"{type(exc).__name__}: {exc}"
            rec["end_ns"] = clock()
            done.append(rec)
            return
        rec["request_id"] = next_id
        live[next_id] = (handle, rec, req)
        next_id += 1

    def is_running(handle: Any) -> bool:
        status = handle.get_status()
        return status == running if running is not None else getattr(status, "name", str(status)) == "RUNNING"

    while queue and len(live) < concurrency:
        submit()
    while live:
        batch.append(len(live))
        t0 = clock()
        pipe.step()
        now = clock()
        steps.append(now - t0)
        for rid in list(live):
            handle, rec, req = live[rid]
            ids = read_tokens(handle)
            got = len(ids)
            rec["output_ids"].extend(ids)
            rec["token_ns"].extend([now] * got)
            rec["num_output_tokens"] += got
            if got:
                rec["step_tokens"].append(got)
            if not is_running(handle):
                status = handle.get_status()
                name = getattr(status, "name", str(status))
                if name != "FINISHED":
                    rec["error"] = f"the pipeline ended the request with status {name}"
                elif req.ignore_eos and rec["num_output_tokens"] != req.max_tokens:
                    rec["error"] = f"{rec['num_output_tokens']} tokens instead of {req.max_tokens}"
                elif not req.ignore_eos and not 0 < rec["num_output_tokens"] <= req.max_tokens:
                    rec["error"] = f"{rec['num_output_tokens']} tokens (max_tokens {req.max_tokens})"
                rec["end_ns"] = now
                done.append(rec)
                del live[rid]
        while queue and len(live) < concurrency:
            submit()
        if live and not pipe.has_non_finished_requests():
            for _handle, rec, _req in live.values():
                rec["error"] = "the pipeline has no unfinished requests but this one did not finish"
                rec["end_ns"] = clock()
                done.append(rec)
            live.clear()
    stats = {
        "steps": len(steps),
        "step_ms_mean": (sum(steps) / len(steps) / 1e6) if steps else None,
        "step_ms_median": (sorted(steps)[len(steps) // 2] / 1e6) if steps else None,
        "live_mean": (sum(batch) / len(batch)) if batch else None,
        "next_id": next_id,
    }
    return sorted(done, key=lambda r: r["index"]), stats


# ---------------------------------------------------------------------------------------------------------------
# The pipeline


@contextlib.contextmanager
def _stdout_to(path: Path) -> Iterator[None]:
    """fd 1 into `path` (OpenVINO's C++ prints the compiled models' properties there with OPENVINO_LOG_LEVEL)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with path.open("wb") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def parse_compiled_properties(text: str) -> dict[str, dict[str, str]]:
    """'Model: NAME' blocks of `KEY: value` lines (what OpenVINO GenAI logs at OPENVINO_LOG_LEVEL >= 3)."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("Model: "):
            current = out.setdefault(line[len("Model: ") :].strip(), {})
        elif current is not None and line.startswith("  ") and ":" in line:
            k, _, v = line.strip().partition(":")
            current[k.strip()] = v.strip()
        elif not line.startswith(" "):
            current = None
    return out


def parse_acceptance_rates(text: str) -> dict[int, list[float]]:
    """'Request_id: N ||| r1 r2 ...' lines: the per-step acceptance rates (%) that GenAI's prompt-lookup pipeline
    prints to stdout whenever it runs out of requests (SpeculativeDecodingMetrics::print_acceptance_rates, then
    clean_up): one value per step that verified drafts for request N, accepted / drafted × 100 of that step."""
    out: dict[int, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("Request_id: ") and "|||" in line:
            head, _, values = line.partition("|||")
            try:
                rid = int(head[len("Request_id: ") :].strip())
                out.setdefault(rid, []).extend(float(v) for v in values.split())
            except ValueError:
                continue
    return out


@contextlib.contextmanager
def _acceptance_log(enabled: bool) -> Iterator[dict[int, list[float]]]:
    """With `enabled`, fd 1 goes to a file while the block runs and the yielded dict is filled afterwards with the
    acceptance rates GenAI printed there (parse_acceptance_rates); otherwise nothing happens (an empty dict)."""
    rates: dict[int, list[float]] = {}
    if not enabled:
        yield rates
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "sd-metrics.log"
        try:
            with _stdout_to(log):
                yield rates
        finally:
            rates.update(parse_acceptance_rates(log.read_text(errors="replace")))


def open_pipeline(og: Any, model_dir: Path, precision: str, settings: PipelineSettings) -> tuple[Any, dict]:
    """A ContinuousBatchingPipeline on `model_dir`; (pipe, facts: load time and the compiled LLM's properties)."""
    os.environ.setdefault("OPENVINO_LOG_LEVEL", "3")  # the compiled models' properties, captured below
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ov.log"
        t0 = time.perf_counter()
        with _stdout_to(log):
            pipe = og.ContinuousBatchingPipeline(
                str(model_dir), scheduler_config(og, settings), "CPU", settings.properties(precision)
            )
        load_s = time.perf_counter() - t0
        props = parse_compiled_properties(log.read_text(errors="replace"))
    llm = next((v for k, v in props.items() if "LLM" in k or "Paged" in k), {})
    keep = (
        "INFERENCE_PRECISION_HINT",
        "KV_CACHE_PRECISION",
        "KEY_CACHE_PRECISION",
        "VALUE_CACHE_PRECISION",
        "INFERENCE_NUM_THREADS",
        "NUM_STREAMS",
        "PERFORMANCE_HINT",
        "EXECUTION_DEVICES",
    )
    return pipe, {
        "load_s": load_s,
        "compiled": {k: llm[k] for k in keep if k in llm},
        "models": sorted(props),
    }


def generation_config(
    og: Any,
    max_tokens: int,
    ignore_eos: bool = True,
    stop_token_ids: Sequence[int] = (),
    settings: PipelineSettings | None = None,
) -> Any:
    """Greedy; exactly `max_tokens` tokens (EOS ignored, min_new_tokens = max_new_tokens), or with `ignore_eos`
    False up to `max_tokens`, stopping at the model's EOS and `stop_token_ids`. With `settings.prompt_lookup_tokens`
    K > 0: prompt-lookup decoding (num_assistant_tokens K, max_ngram_size settings.prompt_lookup_ngram)."""
    cfg = og.GenerationConfig()
    cfg.max_new_tokens = max_tokens
    cfg.do_sample = False
    if ignore_eos:
        cfg.min_new_tokens = max_tokens
        cfg.ignore_eos = True
    else:
        cfg.ignore_eos = False
        if stop_token_ids:
            cfg.stop_token_ids = {int(t) for t in stop_token_ids}
    if settings is not None and settings.prompt_lookup_tokens > 0:
        cfg.num_assistant_tokens = settings.prompt_lookup_tokens
        cfg.max_ngram_size = settings.prompt_lookup_ngram
    return cfg


def _input_ids(req: PeerRequest) -> Any:
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.asarray([req.ids], dtype=np.int64))


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in ("openvino", "openvino-genai", "openvino-tokenizers", "transformers", "tokenizers", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def run_bench(
    model_dir: Path, requests_doc: dict[str, Any], precision: str, settings: PipelineSettings
) -> dict:
    """The warm-up and every level on one pipeline; the raw result document (SCHEMA)."""
    og = _import_genai()
    warm = [PeerRequest.from_dict(d) for d in requests_doc["warmup"]]
    levels = {int(c): [PeerRequest.from_dict(d) for d in reqs] for c, reqs in requests_doc["levels"].items()}
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "precision": precision,
        "settings": asdict(settings),
        "properties": settings.properties(precision),
        "versions": _versions(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "ids_sha256": requests_doc.get("ids_sha256"),
        "workload": requests_doc.get("workload"),
        "warmup_requests": len(warm),
        "levels": {},
    }
    pipe, facts = open_pipeline(og, model_dir, precision, settings)
    doc.update(facts)
    doc["scheduler"] = scheduler_config(og, settings).to_string()
    configs: dict[tuple[int, bool, tuple[int, ...]], Any] = {}

    def make_config(req: PeerRequest) -> Any:
        key = (req.max_tokens, req.ignore_eos, req.stop_token_ids)
        if key not in configs:
            configs[key] = generation_config(og, *key, settings=settings)
        return configs[key]

    running = og.GenerationStatus.RUNNING
    next_id = 0
    lookup = settings.prompt_lookup_tokens > 0
    if warm:
        c = min(max(levels) if levels else 1, len(warm))
        with _acceptance_log(lookup):
            recs, stats = closed_loop(pipe, warm, c, _input_ids, make_config, next_id, running=running)
        next_id = stats["next_id"]
        doc["warmup"] = {"concurrency": c, "errors": [r["error"] for r in recs if r["error"]], **stats}
    for c, reqs in levels.items():
        with _acceptance_log(lookup) as rates:
            recs, stats = closed_loop(pipe, reqs, c, _input_ids, make_config, next_id, running=running)
        if lookup:
            for r in recs:
                r["acceptance_rates"] = rates.get(r.get("request_id", -1))
        next_id = stats["next_id"]
        m = pipe.get_metrics()
        stats["max_cache_usage"] = m.max_cache_usage
        stats["cache_size_in_bytes"] = m.cache_size_in_bytes
        doc["levels"][str(c)] = {"records": recs, **stats}
        ok = [r for r in recs if not r["error"] and r["token_ns"]]
        ttft = sorted((r["token_ns"][0] - r["send_ns"]) / 1e6 for r in ok)
        print(
            f"{precision} c={c}: {len(ok)}/{len(recs)} ok, TTFT p50 {ttft[len(ttft) // 2] if ttft else 0:.0f} ms, "
            f"{stats['steps']} steps, step mean {stats['step_ms_mean'] or 0:.1f} ms",
            file=sys.stderr,
            flush=True,
        )
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    del pipe
    return doc


def greedy_tokens(
    model_dir: Path, prompts: list[list[int]], max_tokens: int, precision: str, settings: PipelineSettings
) -> dict[str, Any]:
    """Greedy tokens per prompt from ContinuousBatchingPipeline (one at a time, then all together) and
    LLMPipeline."""
    import numpy as np
    import openvino as ov

    og = _import_genai()
    pipe, facts = open_pipeline(og, model_dir, precision, settings)
    cfg = generation_config(og, max_tokens, settings=settings)
    alone = []
    for i, ids in enumerate(prompts):
        req = PeerRequest(i, "check", tuple(ids), max_tokens, len(ids))
        recs, _ = closed_loop(
            pipe, [req], 1, _input_ids, lambda _r: cfg, 1000 * i, running=og.GenerationStatus.RUNNING
        )
        alone.append(recs[0])
    handles = [
        pipe.add_request(10_000 + i, ov.Tensor(np.asarray([p], np.int64)), cfg) for i, p in enumerate(prompts)
    ]
    toks: list[list[int]] = [[] for _ in prompts]
    while pipe.has_non_finished_requests():
        pipe.step()
        for i, h in enumerate(handles):
            toks[i].extend(read_tokens(h))
    del pipe
    with tempfile.TemporaryDirectory() as tmp, _stdout_to(Path(tmp) / "ov.log"):
        llm = og.LLMPipeline(str(model_dir), "CPU", **settings.properties(precision))
    single = [list(llm.generate(ov.Tensor(np.asarray([p], np.int64)), cfg).tokens[0]) for p in prompts]
    return {
        "precision": precision,
        "compiled": facts["compiled"],
        "versions": _versions(),
        "continuous_batching_alone": [r["output_ids"] for r in alone],
        "continuous_batching_together": toks,
        "llm_pipeline": single,
        "errors": [r["error"] for r in alone if r["error"]],
    }


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="make the pipeline's model folder from an openvino-cpu engine folder")
    m.add_argument("engine_dir", type=Path)
    m.add_argument("model_dir", type=Path)
    b = sub.add_parser("bench", help="the warm-up and the levels on one pipeline")
    b.add_argument("model_dir", type=Path)
    b.add_argument("requests", type=Path)
    b.add_argument("out", type=Path)
    t = sub.add_parser("tokens", help="greedy tokens for prompt ids (the correctness check)")
    t.add_argument("model_dir", type=Path)
    t.add_argument("ids", type=Path, help='JSON: {"prompts": [[ids...], ...], "max_tokens": N}')
    t.add_argument("out", type=Path)
    for p in (b, t):
        p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
        p.add_argument("--settings", default="{}", help="PipelineSettings fields as JSON")
    args = ap.parse_args(argv)
    if args.cmd == "model":
        _import_genai()
        print(json.dumps(make_model_dir(args.engine_dir, args.model_dir)))
        return
    settings = PipelineSettings.from_dict(json.loads(args.settings))
    if args.cmd == "bench":
        doc = run_bench(args.model_dir, json.loads(args.requests.read_text()), args.precision, settings)
    else:
        spec = json.loads(args.ids.read_text())
        doc = greedy_tokens(
            args.model_dir, spec["prompts"], int(spec["max_tokens"]), args.precision, settings
        )
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
