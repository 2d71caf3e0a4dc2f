"""EngineKv: an engine's KV hand-off — what another engine's KV does here, and what this engine's KV does there.

    kv = engine.kv                                   # LLMEngine.kv (runtime.protocol.KvPort)
    kv.cached_prefix_estimate(ids)                   # routing hint, any thread, nothing pinned
    res = kv.reserve_import(ids, n).result()         # room for n blocks filled from another engine
    engine.submit(ids, params, handoff=KvHandoff(kv_import=res))   # or kv.end_import(res, filled=False)
    handle = engine.submit(ids, params, handoff=KvHandoff(export_prefix=True))
    kv.release_blocks(handle.exported.result())      # once the other engine read them

The calls that change the KV cache manager run on the engine's scheduler thread (`LLMEngine.call`: a Future of
their result); the scheduler thread itself uses the rest — `publish_import` right before it queues an importing
request, `open_export` / `take_exports` / `drop_export` for the export futures of `export_prefix` requests. The
runtime knows nothing of NIXL: host.kv_transfer moves the bytes (`block_memory` says where they are).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from llmkiln.errors import KilnError
from llmkiln.runtime.block_memory import BlockMemory
from llmkiln.runtime.kv_blocks import BlockStore, Reservation
from llmkiln.runtime.request import FinishReason, Request, TokenEvent

T = TypeVar("T")
OnSchedulerThread = Callable[[Callable[[], T]], Future[T]]


class NoPrefixStore(KilnError):
    """A hand-off call on an engine without a prefix store (kv_cache.prefix_reuse is off)."""


class EngineKv:
    """One engine's KV hand-off (see the module docstring). `store`: the prefix store (None: no hand-off);
    `memory`: where its blocks live; `call`: runs a function on the scheduler thread (LLMEngine.call)."""

    def __init__(self, store: BlockStore | None, memory: BlockMemory | None, call: OnSchedulerThread[object]):
        self.store = store
        self._memory = memory
        self._call = call
        self._exports: dict[str, Future[list[int]]] = {}  # export_prefix requests, until they end

    # ------------------------------------------------------------------ any thread (host.kv_transfer)
    @property
    def block_memory(self) -> BlockMemory | None:
        """Where the prefix store's blocks live (None: no store, or a runner without one)."""
        return self._memory if self.store is not None else None

    def cached_prefix_estimate(self, token_ids: Sequence[int]) -> int:
        """Tokens of this prompt's longest stored prefix that a request for it could use (whole blocks, at most
        len - 1), read from any thread WITHOUT the scheduler thread: the store's index is read as it is (dict
        and attribute reads, atomic under the GIL), nothing pinned, no statistics. So it may be a step stale — a
        block evicted or stored meanwhile —: a routing hint (the prefill role's local hand-off decision), never
        a reservation. 0 without a prefix store."""
        store = self.store
        if store is None:
            return 0
        ids = [int(t) for t in token_ids]
        try:
            found = store.lookup(ids, max(0, len(ids) - 1), record=False)
        except (IndexError, KeyError, RuntimeError):  # a concurrent change met mid-walk: no hint
            return 0
        return len(found) * store.tokens_per_block

    def release_blocks(self, block_ids: Sequence[int]) -> Future[None]:
        """Unpin blocks pinned for an export (a request's `handle.exported`)."""
        store = self._store()
        return self._on_thread(lambda: store.unpin(list(block_ids)))

    def reserve_import(self, token_ids: Sequence[int], num_blocks: int) -> Future[Reservation]:
        """Hold room for the first `num_blocks` blocks of this prompt, to be filled from another engine
        (BlockStore.reserve_chain); then `submit(..., handoff=KvHandoff(kv_import=reservation))`, or
        `end_import(res, False)`."""
        store = self._store()
        keys, ids = self._keys(token_ids)
        return self._on_thread(lambda: store.reserve_chain(keys[:num_blocks], ids))

    def end_import(self, reservation: Reservation, filled: bool) -> Future[None]:
        """Publish (filled) or give back a reservation's blocks, without a request."""
        store = self._store()
        return self._on_thread(lambda: store.end_reservation(reservation, filled))

    # ------------------------------------------------------------------ the scheduler thread
    def publish_import(self, reservation: Reservation) -> None:
        """An importing request is about to be queued: its blocks become visible to its admission."""
        if self.store is not None:
            self.store.end_reservation(reservation, filled=True)

    def open_export(self, request_id: str) -> Future[list[int]] | None:
        """The export future of an `export_prefix` request (None without a prefix store: nothing to export)."""
        if self.store is None:
            return None
        fut: Future[list[int]] = Future()
        self._exports[request_id] = fut
        return fut

    def take_exports(
        self, events: Iterable[tuple[Request, TokenEvent]]
    ) -> list[tuple[Request, Future[list[int]]]]:
        """The exports of the requests this step ended normally; set them with `pin_prompt` once the step's
        blocks are published."""
        normal = (FinishReason.STOP.value, FinishReason.LENGTH.value)
        return [
            (request, fut)
            for request, event in events
            if event.finished
            and event.finish_reason in normal
            and (fut := self._exports.pop(request.request_id, None)) is not None
        ]

    def pin_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """Pin the prompt's stored blocks (whole blocks, at most len - 1 tokens) for the other engine to read."""
        store = self._store()
        keys, ids = self._keys(prompt_ids)
        return store.pin_prefix(keys, ids, len(ids) - 1)

    def drop_export(self, request_id: str) -> None:
        """The request ended otherwise (cancelled, failed, shut down): nothing to export."""
        fut = self._exports.pop(request_id, None)
        if fut is not None:
            fut.set_result([])

    def drop_all(self) -> None:
        """The scheduler thread is dying: no export will be pinned."""
        exports, self._exports = self._exports, {}
        for fut in exports.values():
            fut.set_result([])

    # ------------------------------------------------------------------ helpers
    def _store(self) -> BlockStore:
        if self.store is None:
            raise NoPrefixStore("this engine has no prefix store (kv_cache.prefix_reuse is off)")
        return self.store

    def _keys(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        store = self._store()
        ids = [int(t) for t in token_ids]
        usable = max(0, len(ids) - 1) // store.tokens_per_block  # a request computes at least its last token
        return store.block_keys(ids, usable), ids

    def _on_thread(self, fn: Callable[[], T]) -> Future[T]:
        return self._call(fn)  # type: ignore[return-value]
