"""The trtllm-build flag list (TensorRT-LLM 1.2.x, TensorRT-engine path) and a validator for an argv.

Source: ../shared/reference/trtllm-triton.md §1.5 (TRTLLM:tensorrt_llm/commands/build.py, builder.py,
plugin/plugin.py). Every flag an argv may carry is listed here with the kind of value it takes; an argv is
accepted only if every flag is known, takes a valid value, appears once, and the cross-flag rules of the builder
hold (paged context FMHA for KV reuse / chunking, FP8 context FMHA needs context FMHA, no --opt_num_tokens with
--multiple_profiles, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmkiln.errors import BadInput

Kind = Literal["path", "int", "float", "str", "choice", "switch", "pow2"]

PLUGIN_DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8", "disable")
ENABLE = ("enable", "disable")


@dataclass(frozen=True)
class Flag:
    """One trtllm-build flag: the value kind and, for choices, the allowed values."""

    name: str
    kind: Kind
    choices: tuple[str, ...] = ()
    deprecated: str | None = None


def _flags(*items: Flag) -> dict[str, Flag]:
    return {f.name: f for f in items}


TRTLLM_BUILD_FLAGS: dict[str, Flag] = _flags(
    # inputs / outputs
    Flag("--checkpoint_dir", "path"),
    Flag("--model_config", "path"),
    Flag("--build_config", "path"),
    Flag("--output_dir", "path"),
    # shapes and capacity (BuildConfig)
    Flag("--max_batch_size", "int"),
    Flag("--max_input_len", "int"),
    Flag("--max_seq_len", "int"),
    Flag("--max_decoder_seq_len", "int"),
    Flag("--max_num_tokens", "int"),
    Flag("--opt_num_tokens", "int"),
    Flag("--max_beam_width", "int"),
    Flag("--kv_cache_type", "choice", ("continuous", "paged", "disabled")),
    Flag("--paged_kv_cache", "choice", ENABLE, deprecated="use --kv_cache_type paged"),
    Flag("--workers", "int"),
    Flag("--input_timing_cache", "path"),
    Flag("--output_timing_cache", "path"),
    Flag("--gather_context_logits", "switch"),
    Flag("--gather_generation_logits", "switch"),
    Flag("--gather_all_token_logits", "switch"),
    Flag("--logits_dtype", "choice", ("float16", "float32")),
    Flag("--weight_streaming", "switch"),
    Flag("--strip_plan", "switch"),
    Flag("--fast_build", "switch"),
    Flag("--profiling_verbosity", "choice", ("layer_names_only", "detailed", "none")),
    Flag("--visualize_network", "switch"),
    Flag("--dry_run", "switch"),
    Flag("--monitor_memory", "switch"),
    Flag("--max_prompt_embedding_table_size", "int"),
    Flag("--max_multimodal_len", "int"),
    Flag("--max_encoder_input_len", "int"),
    Flag("--lora_dir", "path"),
    Flag("--lora_target_modules", "str"),
    Flag("--max_lora_rank", "int"),
    Flag("--speculative_decoding_mode", "str"),
    Flag("--max_draft_len", "int"),
    # plugins (a dtype, auto, or disable)
    Flag("--gpt_attention_plugin", "choice", PLUGIN_DTYPES),
    Flag("--gemm_plugin", "choice", PLUGIN_DTYPES),
    Flag("--nccl_plugin", "choice", PLUGIN_DTYPES),
    Flag("--moe_plugin", "choice", PLUGIN_DTYPES),
    Flag("--lora_plugin", "choice", PLUGIN_DTYPES),
    Flag("--dora_plugin", "choice", ENABLE),
    Flag("--fp8_rowwise_gemm_plugin", "choice", PLUGIN_DTYPES),
    Flag("--gemm_swiglu_plugin", "choice", ("fp8", "disable")),
    Flag("--low_latency_gemm_swiglu_plugin", "choice", ("fp8", "disable")),
    Flag("--low_latency_gemm_plugin", "choice", ("fp8", "disable")),
    # features (enable / disable)
    Flag("--context_fmha", "choice", ENABLE),
    Flag("--remove_input_padding", "choice", ENABLE),
    Flag("--use_paged_context_fmha", "choice", ENABLE),
    Flag("--use_fp8_context_fmha", "choice", ENABLE),
    Flag("--multiple_profiles", "choice", ENABLE),
    Flag("--use_fused_mlp", "choice", ENABLE),
    Flag("--reduce_fusion", "choice", ENABLE),
    Flag("--user_buffer", "choice", ENABLE),
    Flag("--norm_quant_fusion", "choice", ENABLE),
    Flag("--pp_reduce_scatter", "choice", ENABLE),
    Flag("--streamingllm", "choice", ENABLE),
    Flag("--paged_state", "choice", ENABLE),
    Flag("--tokens_per_block", "pow2"),
)


def parse_argv(argv: list[str], where: str = "trtllm-build argv") -> dict[str, str | bool]:
    """{flag: value} of a `trtllm-build ...` argv; BadInput on an unknown, repeated or malformed flag."""
    if not argv or argv[0] != "trtllm-build":
        raise BadInput(f"{where}: must start with 'trtllm-build', got {argv[:1]}")
    out: dict[str, str | bool] = {}
    i = 1
    while i < len(argv):
        name = argv[i]
        flag = TRTLLM_BUILD_FLAGS.get(name)
        if flag is None:
            raise BadInput(
                f"{where}: unknown flag {name!r} (not in the trtllm-build flag list of TensorRT-LLM 1.2.x)"
            )
        if flag.deprecated:
            raise BadInput(f"{where}: flag {name} is deprecated: {flag.deprecated}")
        if name in out:
            raise BadInput(f"{where}: flag {name} is given twice")
        if flag.kind == "switch":
            out[name] = True
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            raise BadInput(f"{where}: flag {name} needs a value")
        out[name] = _check_value(flag, argv[i + 1], where)
        i += 2
    return out


def _check_value(flag: Flag, value: str, where: str) -> str:
    bad = f"{where}: {flag.name} {value!r}"
    if flag.kind == "choice" and value not in flag.choices:
        raise BadInput(f"{bad} is not one of {', '.join(flag.choices)}")
    if flag.kind in ("int", "pow2"):
        try:
            n = int(value)
        except ValueError:
            raise BadInput(f"{bad} is not an integer") from None
        if n <= 0:
            raise BadInput(f"{bad} must be positive")
        if flag.kind == "pow2" and n & (n - 1):
            raise BadInput(f"{bad} must be a power of two")
    if flag.kind == "path" and not value:
        raise BadInput(f"{bad}: empty path")
    return value


def check_build_rules(flags: dict[str, str | bool], where: str = "trtllm-build argv") -> None:
    """Cross-flag rules of the TensorRT-LLM builder that matter for an in-flight-batching FP8 Llama engine."""

    def on(name: str, default: str) -> bool:
        return flags.get(name, default) == "enable"

    for required in ("--checkpoint_dir", "--output_dir"):
        if required not in flags:
            raise BadInput(f"{where}: {required} is required")
    seq = int(flags.get("--max_seq_len", 0) or 0)
    inp = int(flags.get("--max_input_len", 0) or 0)
    if seq and inp > seq:
        raise BadInput(f"{where}: --max_input_len {inp} exceeds --max_seq_len {seq}")
    if on("--use_fp8_context_fmha", "enable") and not on("--context_fmha", "enable"):
        raise BadInput(f"{where}: --use_fp8_context_fmha enable needs --context_fmha enable")
    if on("--use_paged_context_fmha", "enable") and not on("--context_fmha", "enable"):
        raise BadInput(f"{where}: --use_paged_context_fmha enable needs --context_fmha enable")
    if on("--multiple_profiles", "disable") and "--opt_num_tokens" in flags:
        raise BadInput(f"{where}: --opt_num_tokens cannot be combined with --multiple_profiles enable")
    if flags.get("--gpt_attention_plugin") == "disable":
        raise BadInput(f"{where}: in-flight batching and the paged KV cache need --gpt_attention_plugin")
    if flags.get("--kv_cache_type", "paged") != "paged":
        raise BadInput(f"{where}: the tensorrtllm backend's in-flight batching needs --kv_cache_type paged")
    if not on("--remove_input_padding", "enable"):
        raise BadInput(f"{where}: in-flight batching needs --remove_input_padding enable")
    for plugin in ("--gemm_swiglu_plugin", "--low_latency_gemm_swiglu_plugin"):
        if flags.get(plugin) == "fp8" and not on("--use_fused_mlp", "enable"):
            raise BadInput(f"{where}: {plugin} fp8 needs --use_fused_mlp enable")
