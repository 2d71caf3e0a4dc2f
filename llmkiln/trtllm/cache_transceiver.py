"""The LLM-API options of TensorRT-LLM prefill and decode workers under Dynamo (`dynamo.trtllm
--disaggregation-mode prefill|decode`): the aggregated options (llmkiln.trtllm.llmapi.llm_api_options) plus
`cache_transceiver_config` — how the prefill worker's KV cache reaches the decode worker (TensorRT-LLM's cache
transceiver; backend DEFAULT lets it pick UCX/NIXL) — and the overlap scheduler off on prefill workers, as in
Dynamo 1.6.1's examples. Keys and values are facts (cache_transceiver_facts.json beside this file), checked
here; nothing of tensorrt_llm is imported."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.trtllm.llmapi import llm_api_options

FACTS_FILE = Path(__file__).with_name("cache_transceiver_facts.json")
Role = Literal["prefill", "decode"]
ROLES: tuple[Role, ...] = ("prefill", "decode")


@cache
def facts() -> dict[str, Any]:
    return json.loads(FACTS_FILE.read_text(encoding="utf-8"))


def cache_transceiver_config(recipe: Recipe, backend: str = "DEFAULT") -> dict[str, Any]:
    """CacheTransceiverConfig for the recipe: the backend, and a transfer buffer that holds a whole prompt."""
    f = facts()
    if backend not in f["backends"]:
        raise BadInput(f"cache transceiver backend {backend!r}: one of {', '.join(f['backends'])}")
    config = {"backend": backend, "max_tokens_in_buffer": recipe.limits.max_input_len}
    unknown = set(config) - set(f["fields"])
    if unknown:
        raise BadInput(
            f"CacheTransceiverConfig has no field(s) {sorted(unknown)} in TensorRT-LLM {f['tensorrt_llm']}"
        )
    return config


def disaggregated_llm_api_options(recipe: Recipe, role: Role, backend: str = "DEFAULT") -> dict[str, Any]:
    """LLM(**kwargs) of a prefill or decode worker (the aggregated options + cache transceiver + role settings)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: prefill or decode")
    options = dict(llm_api_options(recipe, target="dynamo"))  # dynamo.trtllm's TensorRT-LLM (pins.json)
    example = facts()["dynamo_examples"][role]
    options["cache_transceiver_config"] = cache_transceiver_config(recipe, backend)
    options["disable_overlap_scheduler"] = bool(example["disable_overlap_scheduler"]) or bool(
        options.get("disable_overlap_scheduler")
    )
    return options
