"""The LLM-API field lists of the TensorRT-LLM each consumer runs, and the check that a set of LLM(**kwargs) keys
only uses them: a key TensorRT-LLM does not know would fail at model load on the GPU host (LlmArgs forbids extra
keys), so llmkiln refuses to write it.

Two targets, one facts file each beside this module (pins.json pairs each with its runtime):
- `triton`: TensorRT-LLM 1.2.1 in the Triton container (llm_api_options.yaml, the llmapi model's model.yaml,
  trtllm-serve): llm_args_facts.json;
- `dynamo`: TensorRT-LLM 1.3.0rc29 in Dynamo 1.6.1's tensorrtllm-runtime image (the llm_api.yaml that
  `kiln deploy dynamo` writes for dynamo.trtllm): llm_args_facts_1.3.0rc29.json.
`speculative_config` is checked against the class its `decoding_type` names (the facts' `speculative` table).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

from llmkiln.errors import BadInput

Target = Literal["triton", "dynamo"]
FACTS_FILES: dict[str, Path] = {
    "triton": Path(__file__).with_name("llm_args_facts.json"),
    "dynamo": Path(__file__).with_name("llm_args_facts_1.3.0rc29.json"),
}
FACTS_FILE = FACTS_FILES["triton"]
TOP_LEVEL = "TorchLlmArgs"


@cache
def facts(target: Target = "triton") -> dict[str, Any]:
    return json.loads(FACTS_FILES[target].read_text(encoding="utf-8"))


def fields(cls: str, target: Target = "triton") -> frozenset[str]:
    return frozenset(facts(target)["classes"][cls])


def speculative_method(method: str, target: Target = "triton") -> dict[str, Any]:
    """{'decoding_type', 'class', 'model_key'} of a recipe speculative.method for the target's TensorRT-LLM."""
    return dict(facts(target)["speculative"]["methods"][method])


def _speculative_class(value: dict[str, Any], target: Target) -> str | None:
    for m in facts(target)["speculative"]["methods"].values():
        if value.get("decoding_type") == m["decoding_type"]:
            return str(m["class"])
    return None


def unknown_keys(
    options: dict[str, Any], cls: str = TOP_LEVEL, prefix: str = "", target: Target = "triton"
) -> list[str]:
    """Dotted names of keys not in the pinned field lists (nested configs checked against their class) and enum
    values not in the pinned enums."""
    nested: dict[str, str] = facts(target)["nested"]
    enums: dict[str, list[str]] = facts(target)["enums"]
    known = fields(cls, target)
    out = []
    for key, value in options.items():
        name = f"{prefix}{key}"
        if key not in known:
            out.append(f"{name} (not a {cls} field)")
        elif key == "speculative_config" and isinstance(value, dict):
            spec_cls = _speculative_class(value, target)
            if spec_cls is None:
                allowed = [m["decoding_type"] for m in facts(target)["speculative"]["methods"].values()]
                out.append(
                    f"{name}.decoding_type={value.get('decoding_type')!r} (allowed: {', '.join(allowed)})"
                )
            else:
                out += unknown_keys(value, spec_cls, f"{name}.", target)
        elif key in nested and isinstance(value, dict):
            out += unknown_keys(value, nested[key], f"{name}.", target)
        elif key in enums and value not in enums[key]:
            out.append(f"{name}={value!r} (allowed: {', '.join(enums[key])})")
    return out


def check_options(options: dict[str, Any], where: str, target: Target = "triton") -> None:
    """BadInput naming every key the target's TensorRT-LLM would reject."""
    bad = unknown_keys(options, target=target)
    if bad:
        raise BadInput(
            f"{where}: LLM-API keys unknown to TensorRT-LLM {facts(target)['tensorrt_llm']} "
            f"({FACTS_FILES[target].name}): {', '.join(bad)}"
        )
