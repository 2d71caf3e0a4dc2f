"""The pinned TensorRT-LLM's LLM-API field lists (llm_args_facts.json beside this file) and the check that a
set of LLM(**kwargs) keys only uses them: a key TensorRT-LLM does not know would fail at model load on the GPU
host (LlmArgs forbids extra keys), so llmkiln refuses to write it."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from llmkiln.errors import BadInput

FACTS_FILE = Path(__file__).with_name("llm_args_facts.json")
TOP_LEVEL = "TorchLlmArgs"


@cache
def facts() -> dict[str, Any]:
    return json.loads(FACTS_FILE.read_text(encoding="utf-8"))


def fields(cls: str) -> frozenset[str]:
    return frozenset(facts()["classes"][cls])


def unknown_keys(options: dict[str, Any], cls: str = TOP_LEVEL, prefix: str = "") -> list[str]:
    """Dotted names of keys not in the pinned field lists (nested configs checked against their class) and enum
    values not in the pinned enums."""
    nested: dict[str, str] = facts()["nested"]
    enums: dict[str, list[str]] = facts()["enums"]
    known = fields(cls)
    out = []
    for key, value in options.items():
        name = f"{prefix}{key}"
        if key not in known:
            out.append(f"{name} (not a {cls} field)")
        elif key in nested and isinstance(value, dict):
            out += unknown_keys(value, nested[key], f"{name}.")
        elif key in enums and value not in enums[key]:
            out.append(f"{name}={value!r} (allowed: {', '.join(enums[key])})")
    return out


def check_options(options: dict[str, Any], where: str) -> None:
    """BadInput naming every key the pinned TensorRT-LLM would reject."""
    bad = unknown_keys(options)
    if bad:
        raise BadInput(
            f"{where}: LLM-API keys unknown to TensorRT-LLM {facts()['tensorrt_llm']} "
            f"({FACTS_FILE.name}): {', '.join(bad)}"
        )
