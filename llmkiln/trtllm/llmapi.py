"""The recipe as TensorRT-LLM LLM-API keyword arguments (PyTorch backend): `llm_api_options(recipe)`.

One mapping, used by every LLM-API consumer: `llm_api_options.yaml` (trtllm-serve --extra_llm_api_options),
the Triton `llmapi` model's model.yaml (whose keys go straight to LLM(**kwargs)), and Dynamo's
`python -m dynamo.trtllm --extra-engine-args`. `model` and `backend` are not in it: each consumer names the
checkpoint and the backend its own way (model.yaml keys, trtllm-serve's positional MODEL and --backend).

Every key is checked against the pinned TensorRT-LLM's LlmArgs field list (llm_args_facts.json, read by
llmkiln.trtllm.facts); recipe fields TensorRT-LLM would ignore are rejected before this runs
(llmkiln.trtllm.rules).
"""

from __future__ import annotations

from typing import Any

from llmkiln.recipe import Recipe

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


def llm_api_options(recipe: Recipe) -> dict[str, Any]:
    """LLM(**kwargs) for the recipe (without `model` and `backend`): JSON/YAML-ready values only."""
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
    return {
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
