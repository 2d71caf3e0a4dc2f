"""The hand-off between a prefill and a decode worker, typed (TensorRT-LLM's DisaggregatedParams): `KvHandle` —
where the prefill engine's exported blocks are — or `LocalPrefill` — prefill the prompt yourself. It travels as
the response's `disaggregated_params` JSON, converted only here (`to_json`, `params_from_json`)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PARAMS_KIND = "llmkiln.kv/1"
LOCAL_KIND = "llmkiln.local/1"  # the hand-off of a prompt the decode worker prefills itself


class HandoffInvalid(ValueError):
    """Hand-off JSON that is not one of ours (the decode worker then prefills the prompt itself)."""


@dataclass(frozen=True)
class KvHandle:
    """Where a prefill engine's exported blocks are: its NIXL agent (name, metadata), the export, the block
    memory's layout and arrays (base address, bytes per block), the block ids in chain order."""

    agent: str
    metadata: bytes
    export_id: str
    layout: Mapping[str, object]
    arrays: tuple[tuple[int, int], ...]
    block_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": PARAMS_KIND,
            "agent": self.agent,
            "metadata": base64.b64encode(self.metadata).decode("ascii"),
            "export_id": self.export_id,
            "layout": dict(self.layout),
            "arrays": [list(a) for a in self.arrays],
            "block_ids": list(self.block_ids),
        }


@dataclass(frozen=True)
class LocalPrefill:
    """A prompt the decode worker prefills itself: short enough (its uncached part at most `limit` tokens), or —
    `fallback` — any prompt while no prefill worker is up (the launcher's stand-in, llmkiln.dynamo.prefill_standin,
    answers the prefill tier's calls then)."""

    prompt_tokens: int
    uncached_tokens: int
    limit: int
    fallback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": LOCAL_KIND,
            "prompt_tokens": self.prompt_tokens,
            "uncached_tokens": self.uncached_tokens,
            "limit": self.limit,
            "fallback": self.fallback,
        }


DisaggregatedParams = KvHandle | LocalPrefill


def params_from_json(obj: object) -> DisaggregatedParams | None:
    """The hand-off a decode worker received (None: none); HandoffInvalid when it is not one of ours."""
    if obj is None or obj == {}:
        return None
    if not isinstance(obj, Mapping):
        raise HandoffInvalid(f"not a hand-off object: {type(obj).__name__}")
    kind = obj.get("kind")
    try:
        if kind == LOCAL_KIND:
            fallback = obj.get("fallback", False)
            if not isinstance(fallback, bool):
                raise HandoffInvalid("fallback is not a boolean")
            return LocalPrefill(
                int(obj["prompt_tokens"]), int(obj["uncached_tokens"]), int(obj["limit"]), fallback
            )
        if kind == PARAMS_KIND:
            layout = obj["layout"]
            if not isinstance(layout, Mapping):
                raise HandoffInvalid("layout is not an object")
            return KvHandle(
                agent=str(obj["agent"]),
                metadata=base64.b64decode(str(obj["metadata"]), validate=True),
                export_id=str(obj["export_id"]),
                layout=dict(layout),
                arrays=tuple((int(a), int(s)) for a, s in obj["arrays"]),
                block_ids=tuple(int(b) for b in obj["block_ids"]),
            )
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise HandoffInvalid(f"not an llmkiln hand-off: {exc!r}") from None
    raise HandoffInvalid(f"unknown hand-off kind {kind!r}")
