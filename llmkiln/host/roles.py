"""Worker roles: what part of a request's life an engine host serves.

AGGREGATED: prefill and decode in one engine. PREFILL: runs prompts to their first token and exports the prompt's
KV blocks (llmkiln.host.kv_transfer, NIXL); DECODE: imports them into its prefix store before it admits the
request, then decodes. The Dynamo worker registers with the role's `--disaggregation-mode`; the Triton front
door only hosts AGGREGATED engines."""

from __future__ import annotations

import enum


class WorkerRole(enum.StrEnum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def available(self) -> bool:
        """Roles an engine host can run (all three)."""
        return True

    @property
    def moves_kv(self) -> bool:
        """Prefill and decode hosts own a KV transfer agent."""
        return self is not WorkerRole.AGGREGATED
