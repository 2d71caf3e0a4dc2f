"""One request's life on an engine host, the same for every front door.

    with host.serving() as life:        # Refused (counted) while draining; active from here to the end
        life.rejected()                 # the front door found the request malformed (counted)
        handle = life.submit(ids, params, request_id=rid, handoff=plan.handoff)   # RequestRejected/EngineClosed
        ...stream handle's events...    # (counted, re-raised) or tracked for the drain deadline
        life.ended(handle)              # counted by how it ended: finished (TTFT, cached tokens), cancelled, failed

A front door translates between its protocol and this (llmkiln.serve.handler: Triton's responses;
llmkiln.dynamo.worker: Dynamo's chunks and errors); it keeps no request bookkeeping of its own, so both agree on
when a request is active (from its acceptance to its last response), rejected, cancelled or failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmkiln.errors import KilnError
from llmkiln.host.metrics import HostMetrics
from llmkiln.runtime.engine import EngineClosed
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.protocol import ServingEngine, ServingHandle
from llmkiln.runtime.request import FinishReason, RequestRejected, SamplingParams


class Host(Protocol):
    """What a request's life uses of its host (host.engine_host.EngineHost)."""

    @property
    def engine(self) -> ServingEngine: ...

    @property
    def metrics(self) -> HostMetrics: ...

    def track(self, handle: ServingHandle) -> None: ...


class Refused(KilnError):
    """The host takes no new request now (draining or shut down): the message says what to do."""


class RequestLife:
    """A request accepted by `EngineHost.serving()`; see the module docstring."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.handle: ServingHandle | None = None
        self._counted = False

    def rejected(self) -> None:
        """The front door refuses the request itself (bad body, prompt too large to encode)."""
        self._count("rejected")

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        request_id: str | None = None,
        handoff: KvHandoff | None = None,
    ) -> ServingHandle:
        try:
            handle = self.host.engine.submit(
                prompt, params, priority=priority, request_id=request_id, handoff=handoff
            )
        except (RequestRejected, EngineClosed):
            self._count("rejected")
            raise
        self.handle = handle
        self.host.track(handle)
        return handle

    def cancelled(self) -> None:
        """The client left (the front door cancelled the handle); counted unless an outcome was already."""
        self._count("cancelled")

    def failed(self) -> None:
        self._count("failed")

    def ended(self, handle: ServingHandle) -> None:
        """The request's last event came: count it by its finish reason (a normal end records its TTFT and
        cached tokens)."""
        reason = handle.finish_reason
        if reason == FinishReason.ERROR.value:
            self.failed()
        elif reason == FinishReason.CANCELLED.value:
            self.cancelled()
        else:
            self.completed(handle)

    def completed(self, handle: ServingHandle) -> None:
        """The request ended normally (or at a stop word the front door matched): its TTFT and cached tokens."""
        if not self._counted:
            self._counted = True
            ttft = handle.timings.ttft_ns
            self.host.metrics.observe_request(
                handle.num_prompt_tokens, handle.num_cached_tokens, ttft / 1e6 if ttft is not None else None
            )

    def _count(self, what: str) -> None:
        if not self._counted:  # one outcome per request
            self._counted = True
            self.host.metrics.add(what)
