"""The TensorRT-LLM sections of the recipe schema: `trtllm` (both trtllm backends, and the engine path's own
settings), `llmapi` (the LLM-API / PyTorch-backend target, backend trtllm-llmapi) and `speculative` (speculative
decoding on that target; rejected on every other backend).

The shared sections carry one concept each, and the trtllm backends read them instead of keeping a copy:
scheduler.chunked_prefill (enable_chunked_context / enable_chunked_prefill), scheduler.batching (gpt_model_type
inflight_fused_batching / V1), scheduler.max_batch_size, scheduler.max_num_tokens, limits.max_seq_len,
kv_cache.tokens_per_block, kv_cache.prefix_reuse, kv_cache.free_gpu_memory_fraction. Which recipe fields each
backend honours is declared on the fields (llmkiln.capabilities); llmkiln.trtllm.rules keeps the value rules.

recipe.py imports this module (not the other way round), so the section base class is repeated here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmkiln.capabilities import Backend, honoured_by

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]


class _Section(BaseModel):
    """Same policy as recipe.Strict: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class TrtLlm(_Section):
    """TensorRT-LLM settings. The first group applies to both trtllm backends; the rest only to backend trtllm
    (the TensorRT-engine path: trtllm-build and the tensorrtllm Triton model set), see ENGINE_ONLY_FIELDS."""

    # both backends
    tp_size: PositiveInt = Field(1, description="Tensor parallelism (engine: baked into the checkpoint).")
    pp_size: PositiveInt = Field(1, description="Pipeline parallelism (engine: baked into the checkpoint).")
    dtype: Literal["float16", "bfloat16"] = Field(
        "float16", description="dtype of unquantized tensors (engine checkpoint; LLM-API `dtype`)."
    )
    max_beam_width: PositiveInt = Field(1, description="--max_beam_width / LLM-API max_beam_width.")
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = Field(
        "guaranteed_no_evict",
        description="Capacity scheduler: backend batch_scheduler_policy / scheduler_config.capacity_scheduler_policy.",
    )
    max_tokens_in_paged_kv_cache: PositiveInt | None = Field(
        None,
        description="Cap on KV-cache tokens (engine: max_tokens_in_paged_kv_cache; LLM-API: kv_cache_config.max_tokens); "
        "None = whatever kv_cache.free_gpu_memory_fraction yields.",
    )
    kv_cache_host_memory_bytes: NonNegInt = Field(
        0, description="Host offload pool for KV blocks (LLM-API: kv_cache_config.host_cache_size); 0 = none."
    )
    # backend trtllm only: trtllm-build (../shared/reference/trtllm-triton.md §1.5)
    gpt_attention_plugin: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto", description="--gpt_attention_plugin; required for in-flight batching and the paged KV cache."
    )
    gemm_plugin: Literal["auto", "float16", "bfloat16", "float32", "fp8", "disable"] = Field(
        "disable", description="--gemm_plugin; NVIDIA's perf guide: disable for FP8, auto for FP16/BF16."
    )
    use_paged_context_fmha: bool = Field(
        True, description="--use_paged_context_fmha; KV reuse and chunking need it."
    )
    use_fp8_context_fmha: bool = Field(
        True,
        description="--use_fp8_context_fmha; TensorRT-LLM forces it on with an FP8 KV cache and paged context FMHA.",
    )
    multiple_profiles: bool = Field(False, description="--multiple_profiles (longer build, better shapes).")
    use_fused_mlp: bool = Field(True, description="--use_fused_mlp (gate/up GEMM fusion).")
    workers: PositiveInt = Field(1, description="trtllm-build --workers (parallel per-rank builds).")
    # backend trtllm only: tensorrtllm backend parameters (§2.3-2.4)
    cuda_graph_mode: bool = Field(False, description="Backend cuda_graph_mode (executor CUDA graphs).")
    cuda_graph_cache_size: NonNegInt = Field(
        0, description="Backend cuda_graph_cache_size; must be > 0 exactly when cuda_graph_mode is on."
    )
    exclude_input_in_output: bool = Field(True, description="Return only completion tokens.")
    max_queue_delay_microseconds: NonNegInt = Field(0, description="Triton dynamic_batching queue delay.")
    multi_block_mode: bool = Field(True, description="Backend multi_block_mode (long-sequence decode).")
    enable_context_fmha_fp32_acc: bool = Field(False, description="Backend enable_context_fmha_fp32_acc.")
    # backend trtllm only: the python models of the tensorrtllm model set
    preprocessing_instance_count: PositiveInt = Field(4, description="Python tokenizer instances.")
    postprocessing_instance_count: PositiveInt = Field(4, description="Python detokenizer instances.")
    bls_instance_count: PositiveInt = Field(4, description="tensorrt_llm_bls instances.")
    add_special_tokens: bool = Field(True, description="preprocessing add_special_tokens (BOS).")
    skip_special_tokens: bool = Field(True, description="postprocessing skip_special_tokens.")
    accumulate_tokens: bool = Field(False, description="tensorrt_llm_bls accumulate_tokens when streaming.")


ENGINE_ONLY_FIELDS: tuple[str, ...] = (
    "gpt_attention_plugin", "gemm_plugin", "use_paged_context_fmha", "use_fp8_context_fmha", "multiple_profiles",
    "use_fused_mlp", "workers", "cuda_graph_mode", "cuda_graph_cache_size", "exclude_input_in_output",
    "max_queue_delay_microseconds", "multi_block_mode", "enable_context_fmha_fp32_acc",
    "preprocessing_instance_count", "postprocessing_instance_count", "bls_instance_count", "add_special_tokens",
    "skip_special_tokens", "accumulate_tokens",
)  # fmt: skip

# The capability declaration of the engine path's own fields (llmkiln.capabilities): backend trtllm only.
ENGINE_ONLY = honoured_by(
    Backend.TRTLLM, why="a TensorRT-engine setting (backend trtllm); the LLM API has no such option"
)
for _name in ENGINE_ONLY_FIELDS:
    TrtLlm.model_fields[_name].json_schema_extra = ENGINE_ONLY
TrtLlm.model_rebuild(force=True)


class LlmApi(_Section):
    """The LLM-API target (backend trtllm-llmapi): TensorRT-LLM's PyTorch backend loading the ModelOpt unified
    HF checkpoint, served by Triton's `llmapi` python model or `trtllm-serve`. Keys map to LLM(**kwargs)."""

    cuda_graphs: bool = Field(
        True, description="Capture CUDA graphs for decode-only batches (cuda_graph_config; false = null)."
    )
    cuda_graph_padding: bool = Field(
        True, description="cuda_graph_config.enable_padding: round a batch up to the nearest captured size."
    )
    cuda_graph_batch_sizes: list[PositiveInt] | None = Field(
        None,
        description="cuda_graph_config.batch_sizes; None = powers of two up to scheduler.max_batch_size, and it.",
    )
    context_chunking_policy: Literal["first_come_first_served", "equal_progress"] = Field(
        "first_come_first_served",
        description="scheduler_config.context_chunking_policy (used with scheduler.chunked_prefill).",
    )
    disable_overlap_scheduler: bool = Field(
        False, description="disable_overlap_scheduler (the overlap scheduler hides CPU work behind the GPU)."
    )


SPECULATIVE_METHODS = ("ngram", "draft_target", "eagle3")


class Speculative(_Section):
    """Speculative decoding: TensorRT-LLM's `speculative_config` on the LLM-API path (backend trtllm-llmapi), or
    llmkiln's own n-gram drafts on backend openvino-cpu (llmkiln.runtime.ngram_drafts, verified in the step's one
    OpenVINO run; docs/speculative.md).

    A throughput lever: a drafter proposes up to max_draft_len tokens, the target model verifies them in one step.
    Keep it when the acceptance rate times the drafter's speed pays (below ~0.6 acceptance it rarely does);
    scripts/gpu_verify.sh measures both with and without it, experiments.spec_decode on the CPU. Methods are those
    the pinned TensorRT-LLM LLM API offers on the PyTorch backend (llm_args_facts*.json `speculative`): `ngram`
    (prompt lookup, no draft model), `draft_target` (a smaller model of the same tokenizer), `eagle3` (an EAGLE-3
    draft head); openvino-cpu takes `ngram` only. The same fields mean the same on both: max_draft_len,
    max_matching_ngram_size (the longest suffix looked up; llmkiln tries it, then shorter ones down to 1) and
    max_concurrency (speculation off while more sequences decode)."""

    method: Literal["ngram", "draft_target", "eagle3"] = Field(
        description="ngram: NGramDecodingConfig; draft_target: DraftTargetDecodingConfig; eagle3: EAGLE-3 "
        "(EagleDecodingConfig in TensorRT-LLM 1.2.1, Eagle3DecodingConfig in 1.3)."
    )
    max_draft_len: PositiveInt = Field(
        4, description="speculative_config.max_draft_len: tokens drafted per step."
    )
    draft_model: str | None = Field(
        None,
        description="draft_target / eagle3: the draft model as the GPU host (or pod) sees it, a local folder or a "
        "Hugging Face id (speculative_model_dir in 1.2.1, speculative_model in 1.3); not used by ngram.",
    )
    max_matching_ngram_size: PositiveInt = Field(
        2, description="ngram: the longest token pattern looked up in the prompt and output so far."
    )
    max_concurrency: PositiveInt | None = Field(
        None,
        description="speculative_config.max_concurrency: speculation off above this batch size; None = always on.",
    )
    min_matching_ngram_size: PositiveInt = Field(
        1,
        description="ngram on openvino-cpu: the shortest suffix looked up (2: no drafts from a single token's "
        "match, fewer and surer drafts) where a verified row costs something; where it is free (one sequence) "
        "one-token matches are drafted too.",
        json_schema_extra=honoured_by(
            Backend.OPENVINO_CPU,
            why="TensorRT-LLM's NGramDecodingConfig has no lower bound (it matches down to one token)",
        ),
    )

    history_tokens: NonNegInt = Field(
        0,
        description="ngram on openvino-cpu: tokens of earlier requests' outputs kept as a second draft source "
        "(what most often followed the same last tokens there, as SuffixDecoding / vLLM's suffix method), drafted "
        "where a verified row is free (one sequence) and the sequence's own lookup matched on one token or none; "
        "0: off. Output unchanged (drafts are verified); like a prefix cache, a reply resembling earlier replies "
        "comes faster. runtime.draft_history.",
        json_schema_extra=honoured_by(
            Backend.OPENVINO_CPU,
            why="TensorRT-LLM's NGramDecodingConfig looks up the request's own tokens only",
        ),
    )

    @model_validator(mode="after")
    def _method_fields(self) -> Speculative:
        if self.method == "ngram" and self.draft_model is not None:
            raise ValueError("draft_model: method ngram drafts from the prompt itself; remove draft_model")
        if self.method != "ngram" and not self.draft_model:
            raise ValueError(
                f"draft_model: method {self.method} needs the draft model (a folder or a Hugging Face id)"
            )
        if self.method != "ngram" and self.max_matching_ngram_size != 2:
            raise ValueError(f"max_matching_ngram_size: only for method ngram, not {self.method}; remove it")
        if self.method != "ngram" and self.history_tokens:
            raise ValueError(f"history_tokens: only for method ngram, not {self.method}; remove it")
        if self.min_matching_ngram_size > self.max_matching_ngram_size:
            raise ValueError(
                f"min_matching_ngram_size: {self.min_matching_ngram_size} exceeds max_matching_ngram_size "
                f"({self.max_matching_ngram_size}); give at most that"
            )
        return self


# The recipe field (recipe.Recipe.speculative); which backends honour it is declared there (llmkiln.capabilities):
# set on any other backend it is an error naming the field.
SpeculativeField = Speculative | None
