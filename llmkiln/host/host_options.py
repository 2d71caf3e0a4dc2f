"""How a front door opens an engine host, in which role: one options object, checked once, when made.

Both front doors make one: the Triton model from its config.pbtxt parameters (llmkiln.serve.repository
`role_options`), the Dynamo worker from its command line (llmkiln.dynamo.worker_options). Light to import: the
repository writer and the command line check it before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import Recipe
from llmkiln.runtime.compute_priority import ComputePriority
from llmkiln.runtime.compute_priority import check as check_priority


@dataclass(frozen=True)
class HostOptions:
    """How to open an engine, in which role: recipe overrides (nested fields, validated like the recipe when the
    engine loads), the role, its KV transfer options (`kv`: prefill and decode roles only; an aggregated host
    moves no KV, so anything but the defaults there is refused), the CPU priority of the engine's scheduler
    thread (runtime.compute_priority), a step-profile file (default: $LLMKILN_PROFILE, set by `kiln profile`)
    and the engines root a recipe name is looked up in. Checked when made (BadInput naming the flag)."""

    overrides: Mapping[str, Any] | None = None
    role: WorkerRole = WorkerRole.AGGREGATED
    kv: KvTransferOptions = field(default_factory=KvTransferOptions)
    compute_priority: ComputePriority = "normal"
    profile: str | None = None
    engines_root: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", WorkerRole(self.role))  # a role's value string becomes the member
        check_priority(self.compute_priority)
        changed = self.kv.flags_changed()
        if changed and not self.role.moves_kv:
            raise BadInput(
                f"{', '.join(changed)}: KV transfer option(s) of the prefill and decode roles; this host is "
                f"{self.role.value}: give --role prefill or decode, or remove them"
            )

    def engine_overrides(self, recipe: Recipe) -> dict[str, Any]:
        """The recipe overrides this host's engine runs with (`recipe`: the engine's own): `overrides`, and on a
        decode host with local prefills on, its prefill runs capped to --max-local-prefill-tokens while sequences
        decode (scheduler.max_prefill_tokens_decoding, unless the overrides set it or max_prefill_tokens): short
        prompts arriving together are then prefilled in runs of at most that many tokens, so they stall the
        running decodes no longer than one such prompt does (without the cap the TTFT-first scheduler batches
        them up to the recipe's chunk, 512 tokens in bench-optimized); with nothing decoding — a burst of prompts
        reaching an idle decode host — they run together in the recipe's chunk. The same for every front door."""
        out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (self.overrides or {}).items()}
        limit = self.kv.max_local_prefill_tokens
        if self.role is not WorkerRole.DECODE or limit <= 0:
            return out
        sched = out.get("scheduler")
        if isinstance(sched, dict) and (
            "max_prefill_tokens" in sched or "max_prefill_tokens_decoding" in sched
        ):
            return out
        if recipe.scheduler.max_prefill_tokens > limit:  # the overrides leave the chunk as the recipe has it
            out.setdefault("scheduler", {})["max_prefill_tokens_decoding"] = limit
        return out
