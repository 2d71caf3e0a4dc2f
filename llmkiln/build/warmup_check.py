"""The warmup rule every backend shares: each `warmup.prefixes` entry must fill at least one KV block once
tokenized (prefix caches share whole blocks only, so a shorter prefix leaves nothing to reuse), and every
warmup text must fit the engine's prompt limit.

`prefix_problems(recipe, counts, limit)` states the rule on token counts, so each backend tokenizes the way its
server does (CPU runtime: `tokenizers` with special tokens; tensorrtllm preprocessing and the LLM API:
AutoTokenizer). `WarmupCheckStage` applies it to the CPU engines, with the tokenizer.json the runtime loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmkiln.build.stages import BuildContext
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe


def prefix_problems(
    recipe: Recipe, prefix_counts: list[int], prompt_counts: list[int], limit: int
) -> list[str]:
    """'warmup.prefixes[i]: ...' for each prefix shorter than a KV block, and each text over `limit` tokens."""
    block = recipe.kv_cache.tokens_per_block
    out = []
    for i, (text, n) in enumerate(zip(recipe.warmup.prefixes, prefix_counts, strict=True)):
        if n < block:
            out.append(
                f"warmup.prefixes[{i}] is {n} tokens, shorter than one KV block (kv_cache.tokens_per_block = "
                f"{block}): prefix caches share whole blocks, so it would prime nothing. Use the full shared "
                f"system prompt ({text[:50]!r})"
            )
    named = [
        ("prefixes", recipe.warmup.prefixes, prefix_counts),
        ("prompts", recipe.warmup.prompts, prompt_counts),
    ]
    for field, texts, counts in named:
        for i, (text, n) in enumerate(zip(texts, counts, strict=True)):
            if n > limit:
                out.append(f"warmup.{field}[{i}] is {n} tokens, over the prompt limit {limit}: {text[:50]!r}")
    return out


def check_warmup(
    recipe: Recipe, prefix_counts: list[int], prompt_counts: list[int], limit: int, where: str
) -> None:
    problems = prefix_problems(recipe, prefix_counts, prompt_counts, limit)
    if problems:
        raise BadInput(f"{where}: " + "\n  ".join(problems))


class WarmupCheckStage:
    """CPU engines: the warmup texts tokenized with the engine's tokenizer.json, checked, counts recorded."""

    name = "warmup-check"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {
            "warmup": ctx.recipe.warmup.model_dump(mode="json"),
            "block": ctx.recipe.kv_cache.tokens_per_block,
        }

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        from tokenizers import Tokenizer

        r = ctx.recipe
        tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))  # what the runtime encodes with

        def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=True).ids)

        prefixes, prompts = [count(t) for t in r.warmup.prefixes], [count(t) for t in r.warmup.prompts]
        check_warmup(r, prefixes, prompts, r.limits.max_input_len, str(ctx.recipe_file))
        return {
            "prefix_tokens": prefixes,
            "prompt_tokens": prompts,
            "tokens_per_block": r.kv_cache.tokens_per_block,
        }
