"""The prefix block store's changes as Dynamo KV events, so the frontend's KV router knows which worker holds
which prefix.

`KvEventBridge` is a `BlockListener` (llmkiln.runtime.kv_blocks): the scheduler thread hands it stored and
removed blocks, it only queues them; a thread of its own publishes them once the Dynamo worker hands over its
`KvEventPublisher`. A stored event carries the blocks' true token ids (the router matches on tokens) and the
store's own chained keys as block ids (any per-worker unique 64-bit ids work; removals use the same ids). Blocks
of one commit that continue each other's chain go out as one event with the first block's parent.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Protocol

from llmkiln.runtime.kv_blocks import StoredBlock

log = logging.getLogger(__name__)

_INT64 = 1 << 64


class KvPublisher(Protocol):
    """The part of dynamo.llm.KvEventPublisher used here."""

    def publish_stored(
        self,
        token_ids: list[int],
        num_block_tokens: list[int],
        block_hashes: list[int],
        parent_hash: int | None = None,
    ) -> None: ...

    def publish_removed(self, block_hashes: list[int]) -> None: ...


def as_int64(key: int) -> int:
    """A block key as the signed 64-bit integer Dynamo takes (Python's hash() already is one; this guards
    against any other hash function a store may be given)."""
    key %= _INT64
    return key - _INT64 if key >= _INT64 // 2 else key


def chains(blocks: Sequence[StoredBlock]) -> list[list[StoredBlock]]:
    """Split blocks (in commit order) into runs where each block's parent is the previous block."""
    out: list[list[StoredBlock]] = []
    for block in blocks:
        if out and block.parent == out[-1][-1].key:
            out[-1].append(block)
        else:
            out.append([block])
    return out


Event = tuple[str, list[StoredBlock] | list[int]]


class KvEventBridge:
    """Queue the block store's events; publish them from a thread once `start(publisher)` is called."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.published_stored = 0  # blocks
        self.published_removed = 0
        self.dropped = 0

    # -- BlockListener (the engine's scheduler thread) -------------------------------------------------------
    def blocks_stored(self, blocks: Sequence[StoredBlock]) -> None:
        if not self._closed and blocks:
            self._queue.put(("stored", list(blocks)))

    def blocks_removed(self, keys: Sequence[int]) -> None:
        if not self._closed and keys:
            self._queue.put(("removed", list(keys)))

    # -- publishing ------------------------------------------------------------------------------------------
    def start(self, publisher: KvPublisher) -> None:
        """Publish what was queued so far (the warmup's blocks) and everything after, from a daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, args=(publisher,), name="llmkiln-kv-events", daemon=True
        )
        self._thread.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop publishing (events queued until now are still sent, within timeout_s)."""
        self._closed = True
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self, publisher: KvPublisher) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.publish(publisher, event)
            except Exception:  # a lost event only makes routing less precise: keep publishing
                self.dropped += 1
                log.exception("could not publish a KV event")

    def publish(self, publisher: KvPublisher, event: Event) -> None:
        kind, payload = event
        if kind == "removed":
            keys = [as_int64(k) for k in payload if isinstance(k, int)]
            publisher.publish_removed(keys)
            self.published_removed += len(keys)
            return
        for run in chains([b for b in payload if isinstance(b, StoredBlock)]):
            first = run[0]
            publisher.publish_stored(
                token_ids=[t for b in run for t in b.token_ids],
                num_block_tokens=[len(b.token_ids) for b in run],
                block_hashes=[as_int64(b.key) for b in run],
                parent_hash=None if first.parent is None else as_int64(first.parent),
            )
            self.published_stored += len(run)
