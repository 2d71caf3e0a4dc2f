"""Sizes checked against the model and this machine before a CPU build writes anything.

The recipe schema caps every size at a value no deployment reaches; here the KV slot pool the runtime will
allocate (scheduler.max_batch_size x limits.max_seq_len x layers x KV heads x head size x K and V x 4 bytes)
plus the prefix block store (kv_cache.max_bytes) must fit in this machine's physical memory, so a recipe that
cannot load fails at validation (exit 2, naming the fields) instead of at load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmkiln.build.generate import get_spec
from llmkiln.build.stages import BuildContext
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe

POOL_BYTES_PER_VALUE = 4  # the runtime's slot pool is fp32 (or smaller)


def physical_memory_bytes() -> int | None:
    """This machine's physical memory (None when the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def kv_pool_bytes(recipe: Recipe, model_config: dict[str, Any]) -> int | None:
    """Bytes of the runtime's KV slot pool for this recipe and a Hugging Face config.json (None if unknown)."""
    try:
        layers = int(model_config["num_hidden_layers"])
        heads = int(model_config["num_attention_heads"])
        kv_heads = int(model_config.get("num_key_value_heads") or heads)
        head_dim = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    slots, seq = recipe.scheduler.max_batch_size, recipe.limits.max_seq_len
    return 2 * layers * slots * kv_heads * seq * head_dim * POOL_BYTES_PER_VALUE


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_cpu_memory(
    recipe: Recipe, recipe_file: Path, model_config: dict[str, Any], total: int | None = None
) -> None:
    """BadInput naming the fields when the KV pool + prefix store cannot fit in this machine's memory."""
    total = physical_memory_bytes() if total is None else total
    if total is None:
        return
    store = recipe.kv_cache.max_bytes if recipe.kv_cache.prefix_reuse else 0
    if store > total:
        raise BadInput(
            f"{recipe_file}: field 'kv_cache.max_bytes': {store} bytes ({_gib(store)}) is more than this "
            f"machine's memory ({_gib(total)}); use at most a fraction of it, e.g. {total // 8}"
        )
    pool = kv_pool_bytes(recipe, model_config)
    if pool is not None and pool + store > total:
        raise BadInput(
            f"{recipe_file}: fields 'scheduler.max_batch_size' ({recipe.scheduler.max_batch_size}) x "
            f"'limits.max_seq_len' ({recipe.limits.max_seq_len}) need a KV slot pool of {_gib(pool)}"
            f"{f' plus kv_cache.max_bytes {_gib(store)}' if store else ''}; this machine has {_gib(total)}: "
            "lower max_batch_size or max_seq_len"
        )


def check_model_fits(ctx: BuildContext) -> dict[str, Any] | None:
    """The source's config.json (a generated model's before it is made; None when there is none yet), after
    checking that the recipe's pools fit this machine and `limits.max_seq_len` the model's context (BadInput)."""
    config_path = ctx.source.path / "config.json"
    if config_path.is_file():
        config: dict[str, Any] = json.loads(config_path.read_text())
    elif ctx.recipe.model.generated is not None:  # checks run before a generated model is made
        config = get_spec(ctx.recipe.model.generated).hf_config()
    else:
        return None
    check_cpu_memory(ctx.recipe, ctx.recipe_file, config)
    max_pos = config.get("max_position_embeddings")
    if isinstance(max_pos, int) and ctx.recipe.limits.max_seq_len > max_pos:
        raise BadInput(
            f"{ctx.recipe_file}: field 'limits.max_seq_len': {ctx.recipe.limits.max_seq_len} exceeds the "
            f"model's max_position_embeddings ({max_pos}); use at most {max_pos}"
        )
    return config
