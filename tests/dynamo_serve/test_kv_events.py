"""The block store's events → Dynamo KV events (no processes: a recording publisher)."""

from __future__ import annotations

import time

from llmkiln.dynamo.kv_events import KvEventBridge, as_int64, chains
from llmkiln.runtime.kv_blocks import BlockStore, StoredBlock


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def publish_stored(self, token_ids, num_block_tokens, block_hashes, parent_hash=None):
        self.calls.append(
            (
                "stored",
                dict(tokens=token_ids, sizes=num_block_tokens, hashes=block_hashes, parent=parent_hash),
            )
        )

    def publish_removed(self, block_hashes):
        self.calls.append(("removed", dict(hashes=block_hashes)))


def store_prefix(store: BlockStore, tokens: list[int]) -> None:
    parent, written, bs = None, [], store.tokens_per_block
    for i in range(len(tokens) // bs):
        parent, block_id = store.offer(parent, tokens[i * bs : (i + 1) * bs])
        if block_id is not None:
            written.append(block_id)
    store.commit(written)


def test_chains_split_where_the_parent_changes():
    a, b, c = StoredBlock(1, None, (1,)), StoredBlock(2, 1, (2,)), StoredBlock(3, None, (3,))
    d = StoredBlock(4, 3, (4,))
    assert chains([a, b, c, d]) == [[a, b], [c, d]]
    assert chains([a, c, b]) == [[a], [c], [b]]


def test_as_int64_keeps_signed_64_bit_keys_and_folds_others():
    assert as_int64(-5) == -5 and as_int64(2**63 - 1) == 2**63 - 1
    assert as_int64(2**63) == -(2**63) and as_int64(2**64 + 7) == 7


def test_bridge_queues_until_started_then_publishes_true_tokens_and_own_keys():
    store = BlockStore(3, 2)
    bridge = KvEventBridge()
    store.add_listener(bridge)
    store_prefix(store, [5, 6, 7, 8])  # before the publisher exists (the warmup)
    rec = Recorder()
    bridge.start(rec)
    store_prefix(store, [1, 1, 2, 2])  # evicts the LRU's oldest block
    deadline = time.monotonic() + 5
    while len(rec.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    bridge.close()
    keys = store.block_keys([5, 6, 7, 8], 2)
    assert rec.calls[0] == ("stored", dict(tokens=[5, 6, 7, 8], sizes=[2, 2], hashes=keys, parent=None))
    assert rec.calls[1] == ("removed", dict(hashes=[keys[1]]))  # a chain's tail is evicted first
    new = store.block_keys([1, 1, 2, 2], 2)
    assert rec.calls[2][1]["hashes"] == new and rec.calls[2][1]["tokens"] == [1, 1, 2, 2]
    assert bridge.published_stored == 4 and bridge.published_removed == 1 and bridge.dropped == 0


def test_a_failing_publish_is_counted_not_fatal():
    class Broken(Recorder):
        def publish_removed(self, block_hashes):
            raise RuntimeError("socket gone")

    bridge = KvEventBridge()
    rec = Broken()
    bridge.start(rec)
    bridge.blocks_removed([1])
    bridge.blocks_stored([StoredBlock(9, None, (1, 2))])
    deadline = time.monotonic() + 5
    while not rec.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    bridge.close()
    assert bridge.dropped == 1 and rec.calls[0][0] == "stored"
