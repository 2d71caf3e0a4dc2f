"""N-gram (prompt-lookup) speculative decoding on the CPU, four systems side by side (issue 30, item 5):

    python -m experiments.spec_decode --out bench/results/spec-decode --engine smollm2-ov-bf16 \\
        --concurrency 1,4,8 --requests 16,32,32 --warmup 8 --max-tokens 128 --draft-len 4 --ngram 3

One command, one run, on one engine folder's IR (default smollm2-ov-bf16: SmolLM2-135M-Instruct, bf16):

- `llmkiln-plain`: llmkiln's runtime in-process (llmkiln.runtime.loader.load_engine with the recipe's settings
  plus `--set`), driven like experiments.cpu_peer_llmkiln_inprocess: asyncio closed loops of `concurrency`
  requests, token ids in, each token stamped with perf_counter_ns when its event reaches the loop.
- `llmkiln-ngram`: the same engine with the recipe overrides {"speculative": {"method": "ngram", "max_draft_len":
  K, "max_matching_ngram_size": N}} (what `--set speculative.method=ngram ...` gives). The engine's counters
  spec_drafted_tokens / spec_accepted_tokens / spec_verifications (engine.metrics(), read before and after each
  level) give acceptance = accepted / drafted and mean accepted length = accepted / verifications (None when the
  engine has no such counters).
- `ovgenai-plain`: OpenVINO GenAI's ContinuousBatchingPipeline on the engine's IR, in its own venv
  (`bash scripts/openvino_genai_env.sh`), through experiments/cpu_peer_openvino_genai_worker.py (one thread:
  add_request, step(), read(); tokens stamped after the step that produced them). Precision = the engine's
  (INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION), prefix caching and dynamic split fuse on, `--threads`.
- `ovgenai-lookup`: the same pipeline built with the property prompt_lookup=True, every request's
  GenerationConfig with num_assistant_tokens=K and max_ngram_size=N (GenAI's prompt-lookup decoding). GenAI's
  Python API exposes no acceptance (PromptLookupImpl keeps its SpeculativeDecodingMetrics internal; get_metrics()
  gives PipelineMetrics, EncodedGenerationResult.extended_perf_metrics is None for it). So: the accepted tokens are
  inferred exactly from the stream — a step gives a request 1 + its accepted drafts, accepted = Σ (tokens of a step
  − 1) over the request's steps after its first token —, and the verifications plus GenAI's own acceptance (the
  mean of its per-step accepted/drafted ratios) come from what the pipeline prints to stdout each time it runs out
  of requests ("Request_id: N ||| 0 100 75 ...", captured by the worker per level). Draft counts are printed
  nowhere, so Σ accepted / Σ drafted stays None for GenAI. "tokens per decode step" (decode tokens / decode steps)
  is reported for every system (llmkiln: decode steps = decode tokens − accepted).

Workloads (both greedy, stopping at EOS — post-EOS text would inflate the acceptance —, `--max-tokens` 128):
- `grounded`: input-grounded tasks whose answer repeats the prompt: the paragraphs of
  calibration/english-eval.jsonl, each with one of GROUNDED_TASKS (fix the capitalization of the lower-cased text,
  copy it replacing 'the' with 'THE', extract the sentences with a year or number, summarize, repeat it word for
  word, one sentence per bullet); the (paragraph, task) pairs in a seeded order, no pair twice.
- `open`: open chat with nothing to copy: OPEN_TEMPLATES × their subjects × OPEN_STYLES, seeded, no prompt twice.
Each prompt is one user message rendered with the engine's chat template and tokenized the way the server does
for a chat request (llmkiln.lint.encoder.PromptEncoder: the template writes its own special tokens); both systems
get the same token ids. Requests: the warm-up (`--warmup`, not measured, at the highest concurrency), then per
level its own requests (`--requests`, one number or one per level; no request repeats across levels or the
warm-up, so no prompt is a full prefix-cache hit).

Per system × workload × level (SUMMARY.md, summary.json): requests ok, output tokens, output tok/s (all output
tokens / the level's wall time, first send to last end), decode tok/s per request (Σ(tokens − 1) / Σ(last token −
first token): the speed one stream sees), TPOT p50/p99 ((last − first token) / (n − 1) per request), ITL p50/p99
(every gap between consecutive tokens as is: with speculation the tokens of one step arrive together, gaps of ~0),
TTFT p50/p95, and the speculation columns above. Greedy correctness: for each workload and level the output ids of
llmkiln-ngram against llmkiln-plain and of ovgenai-lookup against ovgenai-plain, request by request (identical
count, the mismatches with their first differing position); llmkiln-plain against ovgenai-plain for information
(two engines: bf16 rounding differs). Note that at c > 1 even plain decoding can differ from itself when batches
form differently (bf16 results depend on the batch shape): a mismatch at c=1 is the one that points at a bug.

Results: OUT/<system>-<workload>.json (BenchReport, llmkiln.bench.report), OUT/summary.json, OUT/SUMMARY.md (the
command at the top); raw records and output ids in RAW (bench/results/raw/spec-decode for the default OUT, else
OUT/raw): <system>-<workload>.jsonl (RequestRecords), <system>-<workload>.outputs.json, the GenAI worker's
<system>-<workload>.raw.json. A system that fails (e.g. an engine that refuses `speculative`) is recorded as
failed with its error and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from experiments.cpu_peer_llmkiln_inprocess import stepped_loop as peer_stepped_loop
from experiments.cpu_peer_openvino_genai import find_engine, prepare_model, records_from_raw
from experiments.cpu_peer_openvino_genai_worker import PRECISIONS, PipelineSettings
from llmkiln.bench.report import RunInfo, make_report, save_records, save_report, write_atomic
from llmkiln.bench.stats import Dist, RequestRecord, level_stats
from llmkiln.bench.workloads import BenchRequest, Workload
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option, recipe_sets
from llmkiln.cpu_features import detect
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput, KilnError
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.requests import PromptRequest

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m experiments.spec_decode"
SCHEMA = "llmkiln.spec-decode/1"
DEFAULT_OUT = Path("bench/results/spec-decode")
DEFAULT_RAW = Path("bench/results/raw/spec-decode")
DATASET = ROOT / "calibration" / "english-eval.jsonl"
WORKER = ROOT / "experiments" / "cpu_peer_openvino_genai_worker.py"
ENV_SCRIPT = ROOT / "scripts" / "openvino_genai_env.sh"
SYSTEMS = ("llmkiln-plain", "llmkiln-ngram", "ovgenai-plain", "ovgenai-lookup")
WORKLOADS = ("grounded", "open")
SPEC_KEYS = (
    "spec_drafted_tokens",
    "spec_accepted_tokens",
    "spec_verifications",
    "spec_history_drafted_tokens",
    "spec_history_accepted_tokens",
)
# (speculative system, its plain reference); the last pair is for information only (two different engines)
COMPARISONS = (
    ("llmkiln-ngram", "llmkiln-plain"),
    ("ovgenai-lookup", "ovgenai-plain"),
    ("ovgenai-plain", "llmkiln-plain"),
)
SPEEDUP_REF = {"llmkiln-ngram": "llmkiln-plain", "ovgenai-lookup": "ovgenai-plain"}

# (group, user message with {text}, lower-case the paragraph first)
GROUNDED_TASKS: tuple[tuple[str, str, bool], ...] = (
    ("fix-caps", "Rewrite the following text, changing nothing but fixing capitalization:\n\n{text}", True),
    ("the-upper", "Copy this paragraph and replace every 'the' with 'THE':\n\n{text}", False),
    ("extract", "Extract the sentences of this text that mention a year or a number:\n\n{text}", False),
    ("summarize", "Summarize the following text:\n\n{text}", False),
    ("repeat", "Repeat the following text exactly, word for word:\n\n{text}", False),
    ("bullets", "Rewrite the following text as a bulleted list, one sentence per bullet:\n\n{text}", False),
)
MIN_PARAGRAPH_WORDS = 20  # the dataset's short lines (headings, captions) are not paragraphs

# (group, template with {}, subjects): open questions with nothing in the prompt to copy
OPEN_TEMPLATES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "story",
        "Write a short story about {}.",
        (
            "a dragon who is afraid of fire",
            "a lighthouse keeper",
            "a robot learning to paint",
            "a lost kitten",
            "a time traveler",
            "a haunted library",
            "a girl who can talk to birds",
            "an old fisherman",
        ),
    ),
    (
        "tips",
        "Give me three tips for {}.",
        (
            "learning to cook",
            "sleeping better",
            "saving money",
            "staying focused",
            "learning a new language",
            "running a first marathon",
            "keeping houseplants alive",
            "public speaking",
        ),
    ),
    (
        "explain",
        "Explain to a child how {} works.",
        (
            "a rainbow",
            "the internet",
            "a refrigerator",
            "an airplane",
            "the heart",
            "a volcano",
            "a bicycle",
            "a compass",
        ),
    ),
    (
        "poem",
        "Write a short poem about {}.",
        (
            "the ocean",
            "autumn leaves",
            "a city at night",
            "friendship",
            "the first snow",
            "a cup of coffee",
            "the mountains",
            "a quiet morning",
        ),
    ),
    (
        "pros-cons",
        "What are the pros and cons of {}?",
        (
            "working from home",
            "electric cars",
            "social media",
            "living in a big city",
            "homeschooling",
            "nuclear power",
            "fast food",
            "online shopping",
        ),
    ),
    (
        "describe",
        "Describe {} in a few sentences.",
        (
            "a perfect weekend",
            "your favorite meal",
            "a busy market",
            "a summer thunderstorm",
            "an ancient castle",
            "a futuristic city",
            "a forest at dawn",
            "a crowded train station",
        ),
    ),
    (
        "plan",
        "Plan {}.",
        (
            "a one-day trip to Rome",
            "a birthday party for a six-year-old",
            "a healthy weekly menu",
            "a morning workout routine",
            "a picnic in the park",
            "a study schedule for an exam",
            "a small vegetable garden",
            "a camping weekend",
        ),
    ),
    (
        "why",
        "Why {}?",
        (
            "is the sky blue",
            "do cats purr",
            "do we dream",
            "do leaves change color in autumn",
            "is exercise good for you",
            "do people yawn",
            "does ice float",
            "do birds migrate",
        ),
    ),
)
OPEN_STYLES = ("", " Keep it brief.", " Use simple words.")


# ---------------------------------------------------------------------------------------------------------------
# Configuration


def int_list(value: str, what: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise BadInput(f"{what} {value!r}: give positive integers, comma-separated") from None
    if not out or any(x <= 0 for x in out):
        raise BadInput(f"{what} {value!r}: give positive integers, comma-separated")
    return out


def name_list(value: str | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if value is None:
        return known
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    bad = [n for n in names if n not in known]
    if not names or bad or len(set(names)) != len(names):
        raise BadInput(f"{what} {value!r}: give distinct names among {', '.join(known)}, comma-separated")
    return names  # the given order (experiments.spec_decode_rounds reverses it every other round)


@dataclass(frozen=True)
class Config:
    out_dir: Path = DEFAULT_OUT
    raw_dir: Path = DEFAULT_RAW
    engine: str = "smollm2-ov-bf16"
    levels: tuple[int, ...] = (1, 4, 8)
    requests: tuple[int, ...] = (16, 32, 32)  # per level
    warmup: int = 8
    max_tokens: int = 128
    draft_len: int = 4
    genai_draft_len: int | None = None  # GenAI's K when it differs from llmkiln's (None: draft_len)
    ngram: int = 3
    ngram_min: int = 2  # llmkiln only: speculative.min_matching_ngram_size (the bundled recipe's)
    history_tokens: int = 0  # llmkiln only: speculative.history_tokens (earlier replies as a draft source)
    seed: int = 0
    systems: tuple[str, ...] = SYSTEMS
    workloads: tuple[str, ...] = WORKLOADS
    sets: dict[str, Any] = field(default_factory=dict)  # --set: recipe overrides for both llmkiln systems
    ovgenai_python: Path | None = None  # None: `bash scripts/openvino_genai_env.sh` prints it
    threads: int = 0  # GenAI's INFERENCE_NUM_THREADS; 0: this process's CPUs
    cache_gb: int = 4
    worker_timeout_s: float = 3600.0
    # llmkiln's loop: "stepped" (OpenVINO GenAI's harness: this thread steps the engine, a finished request's
    # successor goes in before the next step) or "async" (the engine's own thread, asyncio clients: as served)
    harness: str = "stepped"

    @property
    def total_requests(self) -> int:
        return self.warmup + sum(self.requests)

    def ngram_overrides(self) -> dict[str, Any]:
        spec = {
            "method": "ngram",
            "max_draft_len": self.draft_len,
            "max_matching_ngram_size": self.ngram,
            "min_matching_ngram_size": self.ngram_min,
            "history_tokens": self.history_tokens,
        }
        return _merge(self.sets, {"speculative": spec})

    def genai_settings(self, lookup: bool) -> PipelineSettings:
        threads = self.threads or len(os.sched_getaffinity(0))
        return PipelineSettings(
            cache_size_gb=self.cache_gb,
            threads=threads,
            prompt_lookup_tokens=(self.genai_draft_len or self.draft_len) if lookup else 0,
            prompt_lookup_ngram=self.ngram,
        )

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------------------------------------------------------
# Workloads


def paragraphs(path: Path = DATASET) -> list[str]:
    """The paragraphs (blank-line separated, at least MIN_PARAGRAPH_WORDS words) of the dataset's texts."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            for p in json.loads(line)["text"].split("\n\n"):
                if len(p.split()) >= MIN_PARAGRAPH_WORDS:
                    out.append(" ".join(p.split()))
    return out


def grounded_messages(n: int, seed: int) -> list[tuple[str, str]]:
    """(group, user message) for `n` grounded requests: distinct (paragraph, task) pairs in a seeded order."""
    paras = paragraphs()
    pairs = [(p, t) for p in range(len(paras)) for t in range(len(GROUNDED_TASKS))]
    if n > len(pairs):
        raise BadInput(f"grounded: {n} requests asked for, the dataset gives {len(pairs)} distinct ones")
    random.Random(f"spec-decode:grounded:{seed}").shuffle(pairs)
    out = []
    for p, t in pairs[:n]:
        group, template, lower = GROUNDED_TASKS[t]
        out.append((group, template.format(text=paras[p].lower() if lower else paras[p])))
    return out


def open_messages(n: int, seed: int) -> list[tuple[str, str]]:
    """(group, user message) for `n` open-chat requests: distinct prompts in a seeded order."""
    prompts = [
        (group, template.format(subject) + style)
        for group, template, subjects in OPEN_TEMPLATES
        for subject in subjects
        for style in OPEN_STYLES
    ]
    if n > len(prompts):
        raise BadInput(f"open: {n} requests asked for, there are {len(prompts)} distinct ones")
    random.Random(f"spec-decode:open:{seed}").shuffle(prompts)
    return prompts[:n]


@dataclass
class Part:
    """One workload's requests: the warm-up, then each level's own, with their prompt ids."""

    workload: Workload
    warmup: list[BenchRequest]
    levels: dict[int, list[BenchRequest]]
    ids: dict[int, list[int]]


def build_part(name: str, encoder: PromptEncoder, cfg: Config) -> Part:
    """The requests of workload `name`: chat-rendered with the engine's template, token ids as the server makes
    them for a chat request; split into the warm-up and the levels (in order, nothing repeated)."""
    n = cfg.total_requests
    messages = grounded_messages(n, cfg.seed) if name == "grounded" else open_messages(n, cfg.seed)
    requests_ = [
        PromptRequest(lineno=i, data={}, messages=(("user", m),)) for i, (_, m) in enumerate(messages)
    ]
    texts = [encoder.render(r) for r in requests_]
    ids = encoder.encode_requests(requests_, texts)
    reqs = [
        BenchRequest(i, text, cfg.max_tokens, len(tok), group)
        for i, ((group, _), text, tok) in enumerate(zip(messages, texts, ids, strict=True))
    ]
    params = {
        "max_tokens": cfg.max_tokens,
        "greedy": True,
        "stop": "EOS (the engine's stop ids)",
        "chat_template": True,
        "prompt_tokens_mean": sum(len(t) for t in ids) / len(ids),
        "groups": sorted({g for g, _ in messages}),
    }
    if name == "grounded":
        params["dataset"] = str(DATASET.relative_to(ROOT))
    wl = Workload(f"spec-decode-{name}", cfg.seed, params, reqs)
    warm, at = reqs[: cfg.warmup], cfg.warmup
    levels: dict[int, list[BenchRequest]] = {}
    for c, k in zip(cfg.levels, cfg.requests, strict=True):
        levels[c], at = reqs[at : at + k], at + k
    return Part(wl, warm, levels, {r.index: list(t) for r, t in zip(reqs, ids, strict=True)})


# ---------------------------------------------------------------------------------------------------------------
# One level's results


@dataclass
class LevelRun:
    records: list[RequestRecord]
    outputs: dict[int, list[int]]  # request index -> output ids (EOS included when it ended the request)
    spec: dict[str, Any]  # drafted / accepted / verifications / decode_steps (None: unknown)
    step_tokens: dict[int, list[int]] | None = None  # GenAI: tokens per step per request


@dataclass
class SystemRun:
    name: str
    kind: str
    status: str = "ok"
    error: str | None = None
    load_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    levels: dict[str, dict[int, LevelRun]] = field(default_factory=dict)  # workload -> level -> run


def _dist(d: Dist, *ps: str) -> dict[str, float | None]:
    return {p: getattr(d, p) for p in ps}


def level_summary(c: int, run: LevelRun, max_tokens: int) -> dict[str, Any]:
    st = level_stats(c, run.records)
    ok = [r for r in run.records if r.ok]
    decode_tokens = sum(max(0, r.num_output_tokens - 1) for r in ok)
    decode_s = sum((r.token_ns[-1] - r.token_ns[0]) / 1e9 for r in ok if len(r.token_ns) > 1)
    itl = [x for r in ok for x in r.itl_ms()]
    drafted, accepted = run.spec.get("drafted"), run.spec.get("accepted")
    verifications = run.spec.get("verifications")
    steps = run.spec.get("decode_steps")
    if steps is None and accepted is not None:
        steps = decode_tokens - accepted
    return {
        "requests": st.num_requests,
        "ok": st.num_ok,
        "errors": st.errors,
        "output_tokens": sum(r.num_output_tokens for r in ok),
        "output_tokens_mean": st.output_tokens_mean,
        "hit_max_tokens": sum(r.num_output_tokens >= max_tokens for r in ok),
        "prompt_tokens_mean": st.prompt_tokens_mean,
        "wall_s": st.duration_s,
        "output_tok_s": st.output_token_throughput,
        "decode_tok_s_per_request": decode_tokens / decode_s if decode_s else None,
        "tpot_ms": _dist(st.tpot_ms, "p50", "p99", "mean"),
        "itl_ms": _dist(st.itl_ms, "p50", "p99", "mean"),
        "itl_under_1ms_share": sum(x < 1.0 for x in itl) / len(itl) if itl else None,
        "ttft_ms": _dist(st.ttft_ms, "p50", "p95", "mean"),
        "e2e_ms": _dist(st.e2e_ms, "p50", "p95"),
        "spec": {
            "drafted": drafted,
            "accepted": accepted,
            "verifications": verifications,
            "acceptance": accepted / drafted if drafted and accepted is not None else None,
            "mean_accepted_length": accepted / verifications
            if verifications and accepted is not None
            else None,
            "history_drafted": run.spec.get("history_drafted"),
            "history_accepted": run.spec.get("history_accepted"),
            "genai_mean_step_acceptance": run.spec.get("genai_mean_step_acceptance"),
            "decode_tokens": decode_tokens,
            "decode_steps": steps,
            "tokens_per_decode_step": decode_tokens / steps if steps else None,
            # llmkiln: a verified row's learned cost in tokens of a batch of b (runtime.draft_cost), after the level
            "row_cost_by_batch": run.spec.get("row_cost"),
        },
    }


def compare_outputs(ref: dict[int, list[int]], got: dict[int, list[int]]) -> dict[str, Any]:
    """Request by request: identical count and each mismatch's first differing position."""
    common = sorted(set(ref) & set(got))
    mismatches = []
    for i in common:
        a, b = ref[i], got[i]
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            mismatches.append({"index": i, "at": at, "ref_len": len(a), "got_len": len(b)})
    return {"compared": len(common), "identical": len(common) - len(mismatches), "mismatches": mismatches}


# ---------------------------------------------------------------------------------------------------------------
# llmkiln in-process


async def _one(engine: Any, req: BenchRequest, ids: list[int]) -> tuple[RequestRecord, list[int]]:
    from llmkiln.runtime.request import SamplingParams

    rec = RequestRecord(index=req.index, group=req.group, send_ns=time.perf_counter_ns())
    rec.send_wall_ns = time.time_ns()
    rec.num_prompt_tokens = req.num_prompt_tokens
    handle = engine.submit(ids, SamplingParams(max_tokens=req.max_tokens, temperature=0.0))
    out: list[int] = []
    async with contextlib.aclosing(handle.aiter()) as events:
        async for ev in events:
            if ev.token_id is not None:
                rec.token_ns.append(time.perf_counter_ns())
                rec.num_output_tokens += 1
                out.append(ev.token_id)
            if ev.finished:
                break
    rec.end_ns = time.perf_counter_ns()
    rec.num_cached_tokens = handle.num_cached_tokens
    if handle.error:
        rec.error = handle.error
    elif not 0 < rec.num_output_tokens <= req.max_tokens:
        rec.error = f"{rec.num_output_tokens} tokens (max_tokens {req.max_tokens})"
    return rec, out


async def closed_loop(
    engine: Any, requests: Sequence[BenchRequest], ids: dict[int, list[int]], concurrency: int
) -> tuple[list[RequestRecord], dict[int, list[int]]]:
    """`concurrency` requests in flight until all are done (a new one as soon as one ends), like
    experiments.cpu_peer_llmkiln_inprocess.closed_loop; also the output ids per request."""
    pending = list(requests)
    recs: list[RequestRecord] = []
    outs: dict[int, list[int]] = {}

    async def lane() -> None:
        while pending:
            req = pending.pop(0)
            rec, out = await _one(engine, req, ids[req.index])
            recs.append(rec)
            outs[req.index] = out

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(pending)))))
    return sorted(recs, key=lambda r: r.index), outs


def stepped_loop(
    engine: Any, requests: Sequence[BenchRequest], ids: dict[int, list[int]], concurrency: int
) -> tuple[list[RequestRecord], dict[int, list[int]]]:
    """OpenVINO GenAI's harness (experiments.cpu_peer_llmkiln_inprocess.stepped_loop: this thread steps the engine),
    greedy up to max_tokens or EOS; also the output ids per request."""
    from llmkiln.runtime.request import SamplingParams

    outs: dict[int, list[int]] = {}
    recs = peer_stepped_loop(
        engine,
        requests,
        ids,
        concurrency,
        params=lambda req: SamplingParams(max_tokens=req.max_tokens, temperature=0.0),
        outs=outs,
    )
    return recs, outs


def _spec_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    names = {
        "spec_drafted_tokens": "drafted",
        "spec_accepted_tokens": "accepted",
        "spec_verifications": "verifications",
        "spec_history_drafted_tokens": "history_drafted",
        "spec_history_accepted_tokens": "history_accepted",
    }
    return {names[k]: (after[k] - before[k]) if k in after and k in before else None for k in SPEC_KEYS}


def run_llmkiln(
    name: str, folder: EngineDir, overrides: dict[str, Any] | None, parts: dict[str, Part], cfg: Config
) -> SystemRun:
    from llmkiln.runtime.loader import load_engine

    run = SystemRun(name, "llmkiln-inprocess")
    run.info = {"engine": str(folder.path), "overrides": overrides or {}}
    t0 = time.monotonic()
    try:
        eng = load_engine(folder, overrides)
        if cfg.harness == "async":
            eng.start()
    except (
        Exception
    ) as exc:  # e.g. a runtime that refuses `speculative`: recorded, the other systems still run
        run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
        click.echo(f"{name}: the engine did not load: {run.error}", err=True)
        return run
    run.load_s = time.monotonic() - t0
    run.info["settings"] = eng.runtime_settings
    run.info["harness"] = cfg.harness

    def loop(reqs: Sequence[BenchRequest], c: int) -> tuple[list[RequestRecord], dict[int, list[int]]]:
        if cfg.harness == "async":
            return asyncio.run(closed_loop(eng, reqs, part.ids, c))
        return stepped_loop(eng, reqs, part.ids, c)

    speculative = eng.recipe.speculative if eng.recipe is not None else None
    run.info["speculative"] = speculative.model_dump(mode="json") if speculative is not None else None
    try:
        for wname, part in parts.items():
            if part.warmup:
                loop(part.warmup, max(cfg.levels))
            run.levels[wname] = {}
            for c, reqs in part.levels.items():
                before = eng.metrics()
                recs, outs = loop(reqs, c)
                spec = _spec_delta(before, eng.metrics())
                if eng.config.speculative is not None:  # the learned cost of a verified row, in tokens
                    cost = eng.scheduler.draft_cost
                    spec["row_cost"] = {str(b): round(cost.threshold(b), 3) for b in (1, 2, 4, 8, 16)}
                run.levels[wname][c] = LevelRun(recs, outs, spec)
                _progress(name, wname, c, run.levels[wname][c], cfg.max_tokens)
    except Exception as exc:
        run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
        click.echo(f"{name}: failed: {run.error}", err=True)
    finally:
        eng.shutdown(5.0)
    return run


# ---------------------------------------------------------------------------------------------------------------
# OpenVINO GenAI (its venv, the worker)


def genai_python(given: Path | None) -> Path:
    """The GenAI venv's python: `given`, else what scripts/openvino_genai_env.sh prints (it creates the venv the
    first time, about a minute)."""
    if given is not None:
        if not os.access(given, os.X_OK):
            raise BadInput(f"--ovgenai-python {given}: not an executable")
        return given
    out = subprocess.run(
        ["bash", str(ENV_SCRIPT)], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False, timeout=1800
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise KilnError(
            f"bash {ENV_SCRIPT.relative_to(ROOT)} failed (exit {out.returncode}); its stderr is above"
        )
    return Path(lines[-1])


def _worker(python: Path, args: list[str], timeout_s: float) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(python), str(WORKER), *args], cwd=ROOT, env=env, timeout=timeout_s, check=False
    ).returncode


def _request_doc(req: BenchRequest, ids: list[int], stop_ids: Sequence[int]) -> dict[str, Any]:
    return {
        "index": req.index,
        "group": req.group,
        "ids": ids,
        "max_tokens": req.max_tokens,
        "num_prompt_tokens": req.num_prompt_tokens,
        "ignore_eos": False,
        "stop_token_ids": list(stop_ids),
    }


def genai_requests(part: Part, stop_ids: Sequence[int]) -> dict[str, Any]:
    return {
        "workload": part.workload.describe(),
        "warmup": [_request_doc(r, part.ids[r.index], stop_ids) for r in part.warmup],
        "levels": {
            str(c): [_request_doc(r, part.ids[r.index], stop_ids) for r in reqs]
            for c, reqs in part.levels.items()
        },
    }


def _genai_spec(
    step_tokens: dict[int, list[int]], rates: dict[int, list[float] | None], lookup: bool
) -> dict[str, float | None]:
    """Accepted drafts inferred from the stream (a step gives a request 1 + its accepted drafts); verifications and
    GenAI's own acceptance (the mean of its per-step accepted/drafted) from the rates it printed, when it did."""
    accepted = sum(k - 1 for steps in step_tokens.values() for k in steps[1:])
    decode_steps = sum(max(0, len(steps) - 1) for steps in step_tokens.values())
    printed = [x for r in rates.values() if r for x in r]
    known = lookup and any(r is not None for r in rates.values())
    return {
        "drafted": None,  # not observable: GenAI prints per-step ratios, not counts
        "accepted": float(accepted) if lookup else 0.0,
        "verifications": float(len(printed)) if known else (0.0 if not lookup else None),
        "decode_steps": float(decode_steps),
        "genai_mean_step_acceptance": sum(printed) / len(printed) / 100 if printed else None,
    }


def run_genai(
    name: str,
    python: Path,
    model_dir: Path,
    precision: str,
    parts: dict[str, Part],
    stop_ids: Sequence[int],
    cfg: Config,
) -> SystemRun:
    lookup = name == "ovgenai-lookup"
    settings = cfg.genai_settings(lookup)
    run = SystemRun(name, "openvino-genai")
    run.info["precision"] = precision
    run.info.update(model_dir=str(model_dir), settings=asdict(settings))
    cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    for wname, part in parts.items():
        req_path = cfg.raw_dir / f"ovgenai-requests-{wname}.json"
        write_atomic(req_path, json.dumps(genai_requests(part, stop_ids)) + "\n")
        raw_path = cfg.raw_dir / f"{name}-{wname}.raw.json"
        raw_path.unlink(missing_ok=True)
        args = ["bench", str(model_dir), str(req_path), str(raw_path), "--precision", precision]
        rc = _worker(python, [*args, "--settings", json.dumps(asdict(settings))], cfg.worker_timeout_s)
        if rc != 0 or not raw_path.is_file():
            run.status, run.error = (
                "failed",
                f"the GenAI worker failed on {wname} (exit {rc}; its stderr is above)",
            )
            click.echo(f"{name}: {run.error}", err=True)
            continue
        raw = json.loads(raw_path.read_text())
        run.load_s = raw.get("load_s")
        run.info.setdefault("compiled", raw.get("compiled"))
        run.info.setdefault("versions", raw.get("versions"))
        run.info.setdefault("scheduler", raw.get("scheduler"))
        run.levels[wname] = {}
        for c_str, lv in raw["levels"].items():
            c = int(c_str)
            steps = {int(r["index"]): list(r.get("step_tokens") or []) for r in lv["records"]}
            outs = {int(r["index"]): list(r["output_ids"]) for r in lv["records"]}
            rates = {int(r["index"]): r.get("acceptance_rates") for r in lv["records"]}
            spec = _genai_spec(steps, rates, lookup)
            run.levels[wname][c] = LevelRun(records_from_raw(lv), outs, spec, steps)
            _progress(name, wname, c, run.levels[wname][c], cfg.max_tokens)
    return run


# ---------------------------------------------------------------------------------------------------------------
# Reports


def _progress(system: str, workload: str, c: int, lv: LevelRun, max_tokens: int) -> None:
    s = level_summary(c, lv, max_tokens)
    acc = s["spec"]["tokens_per_decode_step"]
    click.echo(
        f"{system} {workload} c={c}: {s['ok']}/{s['requests']} ok, {s['output_tokens']} tokens, "
        f"{s['output_tok_s']:.1f} tok/s, TPOT p50 {s['tpot_ms']['p50'] or 0:.1f} ms"
        + (f", {acc:.2f} tokens/decode step" if acc else ""),
        err=True,
    )


def save_system(run: SystemRun, parts: dict[str, Part], cfg: Config) -> None:
    for wname, levels in run.levels.items():
        label = f"{run.name}-{wname}"
        stats = [level_stats(c, lv.records) for c, lv in levels.items()]
        info = RunInfo(
            label=label,
            system=run.kind,
            model=run.info.get("engine") or run.info.get("model_dir"),
            workload=parts[wname].workload.describe(),
            mode="warm",
            warmup_requests=len(parts[wname].warmup),
            requests_per_level=max((len(lv.records) for lv in levels.values()), default=0),
            api="in-process",
            extra={
                **run.info,
                "load_s": run.load_s,
                "levels": {str(c): level_summary(c, lv, cfg.max_tokens) for c, lv in levels.items()},
            },
        )
        save_report(
            make_report(info, stats, {c: lv.records for c, lv in levels.items()}),
            cfg.out_dir / f"{label}.json",
        )
        save_records({c: lv.records for c, lv in levels.items()}, cfg.raw_dir / f"{label}.jsonl")
        outputs = {
            str(c): {
                "output_ids": {str(i): ids for i, ids in lv.outputs.items()},
                **({"step_tokens": {str(i): s for i, s in lv.step_tokens.items()}} if lv.step_tokens else {}),
            }
            for c, lv in levels.items()
        }
        write_atomic(cfg.raw_dir / f"{label}.outputs.json", json.dumps(outputs) + "\n")


def lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.partition(":")[2].strip()
    return None


def machine() -> dict[str, Any]:
    cpu = detect()
    return {
        "cpu_model": cpu.model,
        "cpu_kind": cpu.kind.value if hasattr(cpu.kind, "value") else str(cpu.kind),
        "lscpu_model_name": lscpu_model(),
        "cores": cpu.cores,
        "cpu": cpu.describe(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def build_summary(
    runs: dict[str, SystemRun],
    parts: dict[str, Part],
    cfg: Config,
    command: str,
    folder: EngineDir,
    precision: str,
) -> dict[str, Any]:
    results: dict[str, dict[str, dict[str, Any]]] = {}
    correctness: dict[str, dict[str, dict[str, Any]]] = {}
    for wname in parts:
        results[wname] = {
            name: {
                str(c): level_summary(c, lv, cfg.max_tokens) for c, lv in run.levels.get(wname, {}).items()
            }
            for name, run in runs.items()
            if run.levels.get(wname)
        }
        correctness[wname] = {}
        for spec_sys, ref_sys in COMPARISONS:
            a, b = runs.get(ref_sys), runs.get(spec_sys)
            if a is None or b is None or wname not in a.levels or wname not in b.levels:
                continue
            correctness[wname][f"{spec_sys} vs {ref_sys}"] = {
                str(c): compare_outputs(a.levels[wname][c].outputs, b.levels[wname][c].outputs)
                for c in cfg.levels
                if c in a.levels[wname] and c in b.levels[wname]
            }
    return {
        "schema": SCHEMA,
        "command": command,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "engine": str(folder.path),
        "precision": precision,
        "config": cfg.describe(),
        "systems": {
            name: {
                "kind": run.kind,
                "status": run.status,
                "error": run.error,
                "load_s": run.load_s,
                **{
                    k: v
                    for k, v in run.info.items()
                    if k in ("overrides", "speculative", "settings", "precision")
                },
            }
            for name, run in runs.items()
        },
        "workloads": {w: p.workload.describe() for w, p in parts.items()},
        "results": results,
        "correctness": correctness,
    }


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def _acceptance_cell(sp: dict[str, Any]) -> str:
    if sp["acceptance"] is not None:
        return f"{sp['acceptance'] * 100:.0f}%"
    if sp.get("genai_mean_step_acceptance") is not None:
        return f"{sp['genai_mean_step_acceptance'] * 100:.0f}%†"
    return "—"


def render_markdown(summary: dict[str, Any]) -> str:
    cfg, m = summary["config"], summary["machine"]
    lines = [
        "# N-gram speculative decoding on the CPU: llmkiln vs OpenVINO GenAI",
        "",
        "Reproduce:",
        "",
        "```",
        summary["command"],
        "```",
        "",
        f"- machine: {m.get('lscpu_model_name') or m['cpu_model']} ({m['cpu_kind']}, {m['cores']} cores), "
        f"load average before the summary {m['loadavg']}",
        f"- engine: `{summary['engine']}` ({summary.get('precision')}); draft length K={cfg['draft_len']}"
        + (f" (GenAI's {cfg['genai_draft_len']})" if cfg.get("genai_draft_len") else "")
        + ", "
        f"max n-gram N={cfg['ngram']}; greedy, stop at EOS, max_tokens {cfg['max_tokens']}; warm-up "
        f"{cfg['warmup']} requests; requests per level {dict(zip(cfg['levels'], cfg['requests'], strict=True))}",
        f"- created {summary['created']}",
        "",
    ]
    for name, s in summary["systems"].items():
        if s["status"] != "ok":
            lines.append(f"- **{name} failed**: {' '.join(str(s['error']).split())}")
    lines.append("")
    head = (
        "| system | c | ok | out tokens | out tok/s | speedup | decode tok/s/req | TPOT p50 | TPOT p99 | "
        "ITL p50 | ITL p99 | TTFT p50 | TTFT p95 | acceptance | mean acc. len | tokens/decode step |"
    )
    for wname, systems in summary["results"].items():
        lines += [f"## {wname}", "", head, "|" + "---|" * 16]
        for name, levels in systems.items():
            for c, s in levels.items():
                ref = SPEEDUP_REF.get(name)
                base = systems.get(ref, {}).get(c) if ref else None
                speedup = (
                    f"×{s['output_tok_s'] / base['output_tok_s']:.2f}"
                    if base and base["output_tok_s"]
                    else ""
                )
                sp = s["spec"]
                acc = _acceptance_cell(sp)
                lines.append(
                    f"| {name} | {c} | {s['ok']}/{s['requests']} | {s['output_tokens']} | {_f(s['output_tok_s'])} | "
                    f"{speedup} | {_f(s['decode_tok_s_per_request'])} | {_f(s['tpot_ms']['p50'], '.2f')} | "
                    f"{_f(s['tpot_ms']['p99'], '.2f')} | {_f(s['itl_ms']['p50'], '.2f')} | "
                    f"{_f(s['itl_ms']['p99'], '.2f')} | {_f(s['ttft_ms']['p50'])} | {_f(s['ttft_ms']['p95'])} | "
                    f"{acc} | {_f(sp['mean_accepted_length'], '.2f')} | "
                    f"{_f(sp['tokens_per_decode_step'], '.2f')} |"
                )
        lines.append("")
        checks = summary["correctness"].get(wname) or {}
        if checks:
            lines += ["Greedy outputs, request by request (identical / compared; first mismatches):", ""]
            for pair, levels in checks.items():
                cells = []
                for c, r in levels.items():
                    first = ", ".join(f"#{x['index']}@{x['at']}" for x in r["mismatches"][:4])
                    cells.append(
                        f"c={c}: {r['identical']}/{r['compared']}" + (f" ({first})" if first else "")
                    )
                lines.append(f"- {pair}: " + "; ".join(cells))
            lines.append("")
    lines += [
        "Columns: out tok/s = all output tokens / the level's wall time; speedup = out tok/s over the plain "
        "twin at the same level; decode tok/s/req = Σ(tokens − 1) / Σ(last − first token time) (one stream's "
        "speed); TPOT = (last − first token) / (n − 1) per request; ITL = every gap between consecutive tokens "
        "as is (speculation delivers a step's tokens together: gaps of ~0); times in ms. acceptance = accepted / "
        "drafted, mean acc. len = accepted / verifications (request-steps that verified at least one draft), "
        "from llmkiln's engine counters. GenAI's Python API exposes no acceptance: its accepted tokens are "
        "inferred from the stream (a step gives a request 1 + its accepted drafts), its verifications and "
        "† acceptance come from the per-step rates its prompt-lookup pipeline prints to stdout (captured by the "
        "worker): † is the mean of per-step accepted/drafted ratios, not Σ accepted / Σ drafted (GenAI prints "
        "no draft counts), and its last step of a request counts as 100%. tokens/decode step = decode tokens / "
        "decode steps (per request-step; 1 without speculation). The last comparison "
        "(GenAI vs llmkiln plain) is for information: two engines round bf16 differently; at c > 1 batch shapes "
        "can change bf16 results even without speculation.",
        "",
    ]
    return "\n".join(lines)


def level_result(out_dir: Path, workload: str, system: str, c: int) -> dict[str, Any] | None:
    """One level of a run's summary.json (`level_summary`'s fields); None where the run has no such file or
    level (the bench/results tables read the rounds with it)."""
    f = out_dir / "summary.json"
    if not f.exists():
        return None
    level: dict[str, Any] | None = (
        json.loads(f.read_text(encoding="utf-8"))["results"].get(workload, {}).get(system, {}).get(str(c))
    )
    return level


def write_summary(summary: dict[str, Any], out_dir: Path) -> Path:
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    md = out_dir / "SUMMARY.md"
    write_atomic(md, render_markdown(summary))
    return md


# ---------------------------------------------------------------------------------------------------------------
# The run


def run(cfg: Config, engines_dir: Path, command: str) -> dict[str, Any]:
    folder = find_engine(cfg.engine, engines_dir)
    precision = folder.recipe().precision
    if precision not in PRECISIONS:
        raise BadInput(f"{folder.path}: precision {precision}; GenAI runs {', '.join(PRECISIONS)}")
    python = model_dir = None
    if any(s.startswith("ovgenai") for s in cfg.systems):  # before anything is measured
        python = genai_python(cfg.ovgenai_python)
        model_dir = python.parents[2] / "models" / folder.path.name  # VENV/bin/python -> VENV/../models/NAME
        if not python.parent.parent.joinpath("pyvenv.cfg").is_file():
            model_dir = cfg.raw_dir / "ovgenai-model" / folder.path.name
        prepare_model(python, folder, model_dir)
    encoder = PromptEncoder.from_engine(folder)
    parts = {w: build_part(w, encoder, cfg) for w in cfg.workloads}
    stop_ids = folder.stop_token_ids()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, SystemRun] = {}
    summary: dict[str, Any] = {}
    for name in cfg.systems:
        click.echo(f"== {name} (load average {[round(x, 2) for x in os.getloadavg()]})", err=True)
        if name == "llmkiln-plain":
            runs[name] = run_llmkiln(name, folder, cfg.sets or None, parts, cfg)
        elif name == "llmkiln-ngram":
            runs[name] = run_llmkiln(name, folder, cfg.ngram_overrides(), parts, cfg)
        else:
            assert python is not None and model_dir is not None
            runs[name] = run_genai(name, python, model_dir, precision, parts, stop_ids, cfg)
        save_system(runs[name], parts, cfg)
        summary = build_summary(runs, parts, cfg, command, folder, precision)
        write_summary(summary, cfg.out_dir)
    click.echo(f"wrote {cfg.out_dir / 'SUMMARY.md'} and {cfg.out_dir / 'summary.json'}", err=True)
    return summary


_ARGV: list[str] = []


@click.command("spec-decode", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Results folder (raw records: bench/results/raw/spec-decode for the default, else OUT/raw).",
)
@click.option("--engine", default="smollm2-ov-bf16", show_default=True, help="Engine folder or recipe name.")
@click.option("--concurrency", default="1,4,8", show_default=True, help="Closed-loop levels.")
@click.option(
    "--requests",
    "requests_",
    default="16,32,32",
    show_default=True,
    help="Requests per level (one or one per level).",
)
@click.option(
    "--warmup", type=int, default=8, show_default=True, help="Warm-up requests per workload and system."
)
@click.option(
    "--max-tokens", type=int, default=128, show_default=True, help="max_tokens per request (stop at EOS)."
)
@click.option("--draft-len", type=int, default=4, show_default=True, help="K: drafted tokens per step.")
@click.option(
    "--genai-draft-len",
    type=int,
    default=None,
    help="ovgenai-lookup's K when it should differ from llmkiln's [default: --draft-len].",
)
@click.option("--ngram", type=int, default=3, show_default=True, help="N: the longest n-gram looked up.")
@click.option(
    "--ngram-min",
    type=int,
    default=2,
    show_default=True,
    help="llmkiln-ngram: the shortest n-gram looked up (speculative.min_matching_ngram_size).",
)
@click.option(
    "--history-tokens",
    type=int,
    default=0,
    show_default=True,
    help="llmkiln-ngram: earlier replies' tokens kept as a second draft source (speculative.history_tokens).",
)
@click.option("--systems", default=None, help=f"A subset of {','.join(SYSTEMS)} [default: all].")
@click.option("--workloads", default=None, help=f"A subset of {','.join(WORKLOADS)} [default: both].")
@click.option("--seed", type=int, default=0, show_default=True, help="The workloads' order.")
@click.option(
    "--set", "sets", multiple=True, help="Recipe fields for both llmkiln systems, SECTION.FIELD=VALUE."
)
@click.option(
    "--ovgenai-python",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The GenAI venv's python [default: what `bash scripts/openvino_genai_env.sh` prints].",
)
@click.option(
    "--threads", type=int, default=0, help="GenAI's INFERENCE_NUM_THREADS [default: this process's CPUs]."
)
@click.option("--cache-gb", type=int, default=4, show_default=True, help="GenAI's KV cache size in GB.")
@click.option(
    "--harness",
    type=click.Choice(["stepped", "async"]),
    default="stepped",
    show_default=True,
    help="llmkiln's loop: stepped (OpenVINO GenAI's: this thread steps the engine) or async (the engine's own "
    "thread and asyncio clients, as served).",
)
@engines_dir_option
def cli(
    out_dir: Path,
    engine: str,
    concurrency: str,
    requests_: str,
    warmup: int,
    max_tokens: int,
    draft_len: int,
    genai_draft_len: int | None,
    ngram: int,
    ngram_min: int,
    history_tokens: int,
    systems: str | None,
    workloads: str | None,
    seed: int,
    sets: tuple[str, ...],
    ovgenai_python: Path | None,
    threads: int,
    cache_gb: int,
    harness: str,
    engines_dir: Path,
) -> int:
    levels = int_list(concurrency, "--concurrency")
    reqs = int_list(requests_, "--requests")
    if len(reqs) == 1:
        reqs = reqs * len(levels)
    if len(reqs) != len(levels):
        raise BadInput(f"--requests {requests_!r}: give one number or one per level ({len(levels)})")
    for what, v, lo in (
        ("--warmup", warmup, 0),
        ("--max-tokens", max_tokens, 1),
        ("--draft-len", draft_len, 1),
        ("--genai-draft-len", draft_len if genai_draft_len is None else genai_draft_len, 1),
    ):
        if v < lo:
            raise BadInput(f"{what} {v}: give at least {lo}")
    if ngram < 1 or threads < 0 or cache_gb < 1 or history_tokens < 0:
        raise BadInput("--ngram and --cache-gb must be at least 1, --threads and --history-tokens at least 0")
    cfg = Config(
        out_dir=out_dir,
        raw_dir=DEFAULT_RAW if out_dir == DEFAULT_OUT else out_dir / "raw",
        engine=engine,
        levels=levels,
        requests=reqs,
        warmup=warmup,
        max_tokens=max_tokens,
        draft_len=draft_len,
        genai_draft_len=genai_draft_len,
        ngram=ngram,
        ngram_min=ngram_min,
        history_tokens=history_tokens,
        seed=seed,
        systems=name_list(systems, SYSTEMS, "--systems"),
        workloads=name_list(workloads, WORKLOADS, "--workloads"),
        sets=recipe_sets(sets, "--set") if sets else {},
        ovgenai_python=ovgenai_python,
        threads=threads,
        cache_gb=cache_gb,
        harness=harness,
    )
    command = " ".join([PROG, *(shlex.quote(a) for a in _ARGV)])
    summary = run(cfg, engines_dir, command)
    failed = [n for n, s in summary.get("systems", {}).items() if s["status"] != "ok"]
    if failed:
        click.echo(f"failed: {', '.join(failed)} (see SUMMARY.md)", err=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    run_command(cli, argv, prog_name=PROG)


if __name__ == "__main__":
    main()
