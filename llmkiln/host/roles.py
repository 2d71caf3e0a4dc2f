"""Worker roles: what part of a request's life an engine host serves.

AGGREGATED is what every host runs today (prefill and decode in one engine). The disaggregated roles have their
place here: a PREFILL host runs prompts to their first token and exports the prompt's KV blocks; a DECODE host
imports them into its prefix store before it admits the request, then decodes. The Dynamo worker registers with
the role's `--disaggregation-mode`; the Triton front door only hosts AGGREGATED engines."""

from __future__ import annotations

import enum


class WorkerRole(enum.StrEnum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def available(self) -> bool:
        """Roles an engine host can run now (prefill/decode separation is not built yet)."""
        return self is WorkerRole.AGGREGATED
