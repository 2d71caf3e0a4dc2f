"""Worker roles: what part of a request's life an engine host serves.

AGGREGATED: prefill and decode in one engine. PREFILL: runs a prompt to its first token and exports the prompt's
KV blocks (llmkiln.host.kv_transfer, NIXL), or — a prompt whose uncached part is short — hands it back at once
for the decode side to prefill; DECODE: imports the exported blocks into its prefix store before it admits the
request (or prefills a handed-back prompt itself), then decodes. Both front doors host every role: the Dynamo
worker takes it as `--role` and registers with the matching Dynamo disaggregation mode
(WorkerConfig.disaggregation_mode); the Triton model as its `role` parameter (`kiln serve --role`), the hand-off
as its `disaggregated_params` input and output.

Every role in llmkiln is a WorkerRole: launch options, worker command lines and deployments hold these members,
and their `str` value is what a command line carries.
"""

from __future__ import annotations

import enum


class WorkerRole(enum.StrEnum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def moves_kv(self) -> bool:
        """Prefill and decode hosts own a KV transfer agent."""
        return self is not WorkerRole.AGGREGATED


# The two tiers of prefill/decode separation, in the order their workers are numbered.
TIERS: tuple[WorkerRole, ...] = (WorkerRole.PREFILL, WorkerRole.DECODE)
