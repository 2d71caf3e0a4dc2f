"""The recipe as TensorRT-LLM LLM-API keyword arguments (PyTorch backend): `llm_api_options(recipe)`.

One mapping, used by every LLM-API consumer: `llm_api_options.yaml` (trtllm-serve --extra_llm_api_options),
the Triton `llmapi` model's model.yaml (whose keys go straight to LLM(**kwargs)), and Dynamo's
`python -m dynamo.trtllm --extra-engine-args`. `model` and `backend` are not in it: each consumer names the
checkpoint and the backend its own way (model.yaml keys, trtllm-serve's positional MODEL and --backend).

`target` picks the TensorRT-LLM the options are for (llmkiln.trtllm.facts): `triton` (1.2.1, the Triton
container: llm_api_options.yaml, model.yaml, trtllm-serve) or `dynamo` (1.3.0rc29, Dynamo 1.6.1's dynamo.trtllm).
The keys are the same for both except `speculative_config`, whose decoding_type and draft-model key differ by
version (the facts' `speculative` table). Every key is checked against the target's LlmArgs field lists;
recipe fields TensorRT-LLM would ignore are rejected before this runs (llmkiln.trtllm.rules).
"""

from __future__ import annotations

from typing import Any

from llmkiln.recipe import Recipe
from llmkiln.trtllm.facts import Target, speculative_method

CAPACITY_POLICIES = {"guaranteed_no_evict": "GUARANTEED_NO_EVICT", "max_utilization": "MAX_UTILIZATION"}
CHUNKING_POLICIES = {"first_come_first_served": "FIRST_COME_FIRST_SERVED", "equal_progress": "EQUAL_PROGRESS"}


def cuda_graph_batch_sizes(recipe: Recipe) -> list[int]:
    """The batch sizes CUDA graphs are captured for: the recipe's list, else powers of two up to
    scheduler.max_batch_size plus max_batch_size itself (with padding, every batch rounds up to one of them)."""
    if recipe.llmapi.cuda_graph_batch_sizes:
        return sorted(set(recipe.llmapi.cuda_graph_batch_sizes))
    top = recipe.scheduler.max_batch_size
    sizes = [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    return sorted({*sizes, top})


def speculative_config(recipe: Recipe, target: Target = "triton") -> dict[str, Any] | None:
    """The recipe's speculative section as the target TensorRT-LLM's YAML speculative_config (None: off)."""
    spec = recipe.speculative
    if spec is None:
        return None
    m = speculative_method(spec.method, target)
    out: dict[str, Any] = {"decoding_type": m["decoding_type"], "max_draft_len": spec.max_draft_len}
    if m["model_key"]:
        out[m["model_key"]] = spec.draft_model
    if spec.method == "ngram":
        out["max_matching_ngram_size"] = spec.max_matching_ngram_size
    if spec.method == "eagle3" and target == "triton":
        # 1.2.1: the one-model path (draft head inside the target), its default. 1.3.0rc27+ has only that path and
        # no eagle3_one_model field (a strict model: Dynamo's 1.3.0rc29 worker would reject the key).
        out["eagle3_one_model"] = True
    if spec.max_concurrency is not None:
        out["max_concurrency"] = spec.max_concurrency
    return out


def llm_api_options(recipe: Recipe, target: Target = "triton") -> dict[str, Any]:
    """LLM(**kwargs) for the recipe (without `model` and `backend`) for the target's TensorRT-LLM: JSON/YAML-ready
    values only."""
    s, kv, t, api = recipe.scheduler, recipe.kv_cache, recipe.trtllm, recipe.llmapi
    kv_cache: dict[str, Any] = {
        "enable_block_reuse": kv.prefix_reuse,
        "dtype": kv.dtype,  # fp8: the checkpoint's calibrated KV scales are used (hf_quant_config.json)
        "free_gpu_memory_fraction": kv.free_gpu_memory_fraction,
        "tokens_per_block": kv.tokens_per_block,
    }
    if t.max_tokens_in_paged_kv_cache is not None:
        kv_cache["max_tokens"] = t.max_tokens_in_paged_kv_cache
    if t.kv_cache_host_memory_bytes:
        kv_cache["host_cache_size"] = t.kv_cache_host_memory_bytes
    scheduler: dict[str, Any] = {"capacity_scheduler_policy": CAPACITY_POLICIES[t.batch_scheduler_policy]}
    if s.chunked_prefill:
        scheduler["context_chunking_policy"] = CHUNKING_POLICIES[api.context_chunking_policy]
    cuda_graphs: dict[str, Any] | None = None
    if api.cuda_graphs:
        # batch_sizes only: TensorRT-LLM 1.x rejects batch_sizes together with a different max_batch_size
        cuda_graphs = {
            "enable_padding": api.cuda_graph_padding,
            "batch_sizes": cuda_graph_batch_sizes(recipe),
        }
    out = {
        "tensor_parallel_size": t.tp_size,
        "pipeline_parallel_size": t.pp_size,
        "dtype": t.dtype,
        "max_batch_size": s.max_batch_size,
        "max_num_tokens": s.max_num_tokens,
        "max_seq_len": recipe.limits.max_seq_len,
        "max_input_len": recipe.limits.max_input_len,
        "max_beam_width": t.max_beam_width,
        "enable_chunked_prefill": s.chunked_prefill,
        "kv_cache_config": kv_cache,
        "scheduler_config": scheduler,
        "cuda_graph_config": cuda_graphs,
        "disable_overlap_scheduler": api.disable_overlap_scheduler,
    }
    spec = speculative_config(recipe, target)
    if spec is not None:
        out["speculative_config"] = spec
    return out
