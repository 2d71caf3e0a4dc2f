"""Prefill/decode separation as a typed KV connector: what a request's KV does across engines, decided in one place.

The split is vLLM's KVConnector's: a *scheduler side* decides per request what to load or send —
`KvConnector.before(token_ids, received)` before the request is submitted (decode: pull the prefill worker's
blocks, or prefill here; prefill: hand a short prompt straight back, else export its blocks at the end) and
`after(handle)` when it has ended (prefill: the hand-off for the decode worker) — and a *worker side*,
host.kv_transfer.KvTransfer, moves the blocks with NIXL from the prefill engine's blocks into the decode engine's
blocks (on the paged OpenVINO runner: pool to pool, no staging copy). What travels between the workers is typed,
like TensorRT-LLM's DisaggregatedParams: `KvHandle` (where the blocks are) or `LocalPrefill` (prefill it
yourself), as JSON only at the front door (`to_json` / `params_from_json`). A front door only translates: it
passes the tokens and the hand-off it received, submits with `plan.handoff`, and answers `plan.answer` or puts
`after`'s hand-off in its last response. The aggregated role's connector does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmkiln.host.disaggregated_params import HandoffInvalid, KvHandle, LocalPrefill, params_from_json
from llmkiln.host.kv_transfer import KvTransfer, TransferFailed
from llmkiln.host.metrics import HostMetrics
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.kv_blocks import Reservation
from llmkiln.runtime.protocol import KvEngine, ServingHandle

log = logging.getLogger("llmkiln.host.kv_connector")


@dataclass(frozen=True)
class ConnectorPlan:
    """The connector's decision for one request, before it is submitted."""

    handoff: KvHandoff | None = None  # submit with this
    answer: LocalPrefill | None = None  # prefill role: answer with this at once, submit nothing
    local_prefill: bool = False  # decode role: prefilled here because the prefill worker said so


class KvConnector:
    """A host's KV connector (see the module docstring); `transfer` is its worker side (None: aggregated)."""

    def __init__(self, role: WorkerRole, metrics: HostMetrics, transfer: KvTransfer | None = None) -> None:
        if role.moves_kv and transfer is None:
            raise ValueError(f"the {role.value} role's connector needs a KV transfer")
        self.role = role
        self.metrics = metrics
        self.transfer = transfer

    @property
    def engine(self) -> KvEngine:
        assert self.transfer is not None
        return self.transfer.engine

    async def before(self, token_ids: Sequence[int], received: object = None) -> ConnectorPlan:
        """What this request loads or sends. `received`: the decode role's hand-off JSON from the prefill
        worker (None: none). A failed or malformed pull is counted and the prompt prefilled here."""
        if self.role is WorkerRole.PREFILL:
            assert self.transfer is not None
            local = self.transfer.local_handoff(token_ids)
            if (
                local is not None
            ):  # a short prompt: the decode worker prefills it; this engine is not involved
                return ConnectorPlan(answer=local)
            return ConnectorPlan(handoff=KvHandoff(export_prefix=True))
        if self.role is WorkerRole.DECODE:
            try:
                params = params_from_json(received)
            except HandoffInvalid as exc:
                self.metrics.add("kv_fallbacks")
                log.warning("not a KV hand-off, prefilling here: %s", exc)
                return ConnectorPlan()
            if isinstance(params, LocalPrefill):
                if params.fallback:  # no prefill worker was up: the tier's stand-in handed it back
                    self.metrics.add("kv_fallbacks")
                    return ConnectorPlan()
                self.metrics.add("kv_local_prefills")
                return ConnectorPlan(local_prefill=True)
            if isinstance(params, KvHandle):
                reservation = await self._pull(params, token_ids)
                if reservation is not None:
                    return ConnectorPlan(handoff=KvHandoff(kv_import=reservation))
        return ConnectorPlan()

    async def after(self, handle: ServingHandle, plan: ConnectorPlan) -> dict[str, Any] | None:
        """Once the request ended normally: the prefill role's hand-off JSON for the decode worker ({}: no
        whole block to move); None for the other roles. Counts a local prefill's tokens."""
        if plan.local_prefill:
            self.metrics.add("kv_local_prefill_tokens", handle.num_prompt_tokens - handle.num_cached_tokens)
        pinning = handle.exported
        if self.role is not WorkerRole.PREFILL or pinning is None or self.transfer is None:
            return None
        try:
            pinned = await asyncio.shield(asyncio.wrap_future(pinning))  # set right after the last step
        except asyncio.CancelledError:  # the client left: release the pins once they arrive
            engine = self.engine
            pinning.add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or engine.kv.release_blocks(f.result())
            )
            raise
        exported = self.transfer.open_export(pinned)
        return exported.to_json() if exported is not None else {}

    async def _pull(self, params: KvHandle, token_ids: Sequence[int]) -> Reservation | None:
        """The prompt's blocks from the prefill worker: a reservation for submit, or None after a failed
        transfer (counted; this worker prefills the prompt)."""
        transfer = self.transfer
        assert transfer is not None
        pulling = asyncio.ensure_future(asyncio.to_thread(transfer.pull, params, list(token_ids)))
        try:
            res, stats = await asyncio.shield(pulling)
        except asyncio.CancelledError:  # the client left: give the reservation back once the pull is done
            engine = self.engine

            def give_back(f: asyncio.Future[Any]) -> None:
                if not f.cancelled() and f.exception() is None:
                    engine.kv.end_import(f.result()[0], filled=False)

            pulling.add_done_callback(give_back)
            raise
        except TransferFailed as exc:
            self.metrics.add("kv_fallbacks")
            log.warning("KV transfer failed, prefilling here: %s", exc)
            return None
        log.debug(
            "pulled %d of %d blocks (%d bytes) in %.2f ms",
            stats.read_blocks,
            stats.offered_blocks,
            stats.nbytes,
            stats.seconds * 1e3,
        )
        return res
