"""What a trtllm recipe may say, beyond which fields each backend honours (declared on the fields themselves,
llmkiln.capabilities, and checked by the recipe schema): the values TensorRT-LLM would override or that have no
effect together, rejected before a build writes anything (the trtllm stages call these from their `check`).

- `recipe_problems(recipe)`: such values, each with the reason and what to do (exit 2 through BadInput). A field
  counts as "set" when it differs from the schema default, so a resolved recipe (every field written out) checks
  the same as the file it came from.
- `model_problems(hf_config)`: the model's attention head size must be one the attention kernels have
  (pins.json attention_head_sizes) and every GEMM dimension a multiple of 16 (FP8 GEMMs). Generated models are
  checked from their spec before they are generated, local models from config.json.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from llmkiln.build.generate import get_spec
from llmkiln.capabilities import Backend
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.trtllm import pins


def _changed(section: BaseModel, name: str) -> bool:
    default = type(section).model_fields[name].get_default(call_default_factory=True)
    return section.model_dump()[name] != default


def recipe_problems(recipe: Recipe) -> list[str]:
    """Every field of a trtllm-backend recipe that TensorRT-LLM would not honour, as 'field: why; what to do'."""
    if not recipe.is_trtllm:
        return []
    b = recipe.backend.value
    out: list[str] = []
    if recipe.kv_cache.dtype != "fp8":
        out.append(
            f"kv_cache.dtype: {recipe.kv_cache.dtype!r}; backend {b} runs an FP8 KV cache with the calibrated "
            "scales (ModelOpt kv_cache_quant_algo FP8): set kv_cache.dtype: fp8"
        )
    if recipe.scheduler.policy != "fcfs":
        out.append(
            f"scheduler.policy: {recipe.scheduler.policy!r}; TensorRT-LLM's executor schedules first come first "
            "served (capacity policy: trtllm.batch_scheduler_policy): set scheduler.policy: fcfs"
        )
    if not recipe.scheduler.chunked_prefill and recipe.scheduler.max_num_tokens < recipe.limits.max_seq_len:
        out.append(
            f"scheduler.max_num_tokens: {recipe.scheduler.max_num_tokens} is below limits.max_seq_len "
            f"({recipe.limits.max_seq_len}) with scheduler.chunked_prefill false: TensorRT-LLM rejects a prompt "
            "longer than max_num_tokens. Raise max_num_tokens or enable chunked prefill"
        )
    out += _engine_problems(recipe) if recipe.backend is Backend.TRTLLM else _llmapi_problems(recipe)
    return out


def _engine_problems(recipe: Recipe) -> list[str]:
    t, out = recipe.trtllm, []
    if t.use_paged_context_fmha and not t.use_fp8_context_fmha:
        out.append(
            "trtllm.use_fp8_context_fmha: false would be overridden: TensorRT-LLM forces FP8 context FMHA on with "
            "an FP8 KV cache and paged context FMHA. Set it true (or use_paged_context_fmha false, which also "
            "turns off KV reuse and chunking)"
        )
    if t.cuda_graph_mode and t.cuda_graph_cache_size == 0:
        out.append(
            "trtllm.cuda_graph_cache_size: 0 with cuda_graph_mode true caches no graph, so the mode has no "
            "effect; set a cache size (e.g. the number of batch sizes you serve) or cuda_graph_mode false"
        )
    if not t.cuda_graph_mode and t.cuda_graph_cache_size > 0:
        out.append(
            f"trtllm.cuda_graph_cache_size: {t.cuda_graph_cache_size} has no effect with cuda_graph_mode false "
            "(TensorRT-LLM's executor warns and ignores it); set it to 0 or enable cuda_graph_mode"
        )
    return out


def _llmapi_problems(recipe: Recipe) -> list[str]:
    out = []
    if recipe.scheduler.batching != "inflight":
        out.append("scheduler.batching: static; TensorRT-LLM's PyTorch backend batches in flight only")
    top = recipe.scheduler.max_batch_size
    over = [b for b in recipe.llmapi.cuda_graph_batch_sizes or [] if b > top]
    if over:
        out.append(f"llmapi.cuda_graph_batch_sizes: {over} exceed scheduler.max_batch_size ({top})")
    if not recipe.llmapi.cuda_graphs and (
        _changed(recipe.llmapi, "cuda_graph_batch_sizes") or _changed(recipe.llmapi, "cuda_graph_padding")
    ):
        out.append(
            "llmapi.cuda_graph_batch_sizes / cuda_graph_padding: no effect with llmapi.cuda_graphs false"
        )
    if not recipe.scheduler.chunked_prefill and _changed(recipe.llmapi, "context_chunking_policy"):
        out.append("llmapi.context_chunking_policy: no effect with scheduler.chunked_prefill false")
    return out


def model_problems(hf_config: dict[str, Any]) -> list[str]:
    """Head size and FP8 GEMM alignment of a Llama-family HF config."""
    heads = int(hf_config.get("num_attention_heads") or 0)
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    hidden = int(hf_config.get("hidden_size") or 0)
    head_dim = int(hf_config.get("head_dim") or (hidden // heads if heads else 0))
    sizes = list(pins.pin("attention_head_sizes"))
    align = int(pins.pin("fp8_gemm_alignment"))
    out = []
    if head_dim not in sizes:
        out.append(
            f"head size {head_dim} (head_dim / hidden_size // num_attention_heads) is not supported by "
            f"TensorRT-LLM's attention kernels; supported: {', '.join(map(str, sizes))}"
        )
    dims = {
        "hidden_size": hidden,
        "intermediate_size": int(hf_config.get("intermediate_size") or 0),
        "vocab_size": int(hf_config.get("vocab_size") or 0),
        "num_attention_heads * head_dim": heads * head_dim,
        "num_key_value_heads * head_dim": kv_heads * head_dim,
    }
    for name, value in dims.items():
        if value % align:
            out.append(
                f"{name} {value} is not a multiple of {align} (FP8 GEMMs need {align}-aligned dimensions)"
            )
    return out


def hf_config_of(recipe: Recipe, config_json: dict[str, Any] | None) -> dict[str, Any]:
    """The model's HF config: config.json's when the folder exists, else (a generated model not made yet) its
    spec's, so a bad shape is reported before anything is generated."""
    if config_json is not None:
        return config_json
    if recipe.model.generated is not None:
        return get_spec(recipe.model.generated).hf_config()
    return {}


def recipe_and_model_problems(recipe: Recipe, config_json: dict[str, Any] | None) -> list[str]:
    """Every problem of the recipe and of its model's shape for a trtllm backend."""
    problems = recipe_problems(recipe)
    if recipe.is_trtllm:
        src = "config.json" if config_json is not None else f"generated {recipe.model.generated}"
        problems += [f"model ({src}): {p}" for p in model_problems(hf_config_of(recipe, config_json))]
    return problems


def raise_problems(recipe: Recipe, where: str, problems: list[str]) -> None:
    """BadInput (exit 2) listing every problem, or nothing."""
    if problems:
        raise BadInput(f"{where}: recipe {recipe.name} cannot be built for backend {recipe.backend}:\n  "
                       + "\n  ".join(problems))  # fmt: skip
