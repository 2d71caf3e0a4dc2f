"""Prefix block store bookkeeping: chained keys, pins, LRU eviction, collision guard."""

from __future__ import annotations

import pytest

from llmkiln.runtime.kv_blocks import BlockStore


def _store_prefix(store: BlockStore, tokens: list[int]) -> list[int]:
    parent, written = None, []
    bs = store.tokens_per_block
    for i in range(len(tokens) // bs):
        parent, block_id = store.offer(parent, tokens[i * bs : (i + 1) * bs])
        if block_id is not None:
            written.append(block_id)
    store.commit(written)
    return written


def test_chained_lookup_longest_prefix():
    store = BlockStore(8, 4)
    a = list(range(100, 112))
    assert len(_store_prefix(store, a)) == 3
    assert len(store.lookup(a + [1, 2], 100)) == 3
    assert len(store.lookup(a[:8] + [0, 0, 0, 0], 100)) == 2
    assert store.lookup([0] + a[1:], 100) == []
    # same block content after a different prefix is a different key
    assert len(store.lookup(a[4:8] + a[4:8], 100)) == 0
    assert len(store.lookup(a, 11)) == 2  # max_tokens caps whole blocks
    assert store.num_lookups == 5 and store.num_hits == 3 and store.num_hit_tokens == 4 * 7
    store.check_invariants()


def test_offer_dedups_and_not_ready_blocks_are_invisible():
    store = BlockStore(4, 2)
    key, block_id = store.offer(None, [5, 6])
    assert block_id is not None
    assert store.lookup([5, 6, 7], 10) == []  # written this step, not committed yet
    key2, dup = store.offer(None, [5, 6])
    assert key2 == key and dup is None
    store.commit([block_id])
    assert store.lookup([5, 6, 7], 10) == [block_id]


def test_lru_evicts_unpinned_oldest_and_keeps_pinned():
    store = BlockStore(3, 2)
    b1 = _store_prefix(store, [1, 1])
    b2 = _store_prefix(store, [2, 2])
    _store_prefix(store, [3, 3])
    store.pin(b2)
    store.lookup([1, 1, 9], 10)  # a lookup alone does not refresh recency; pinning/unpinning does
    store.pin(b1)
    store.unpin(b1)  # b1 becomes most recent
    _store_prefix(store, [4, 4])  # evicts b3 (oldest unpinned)
    assert store.lookup([3, 3, 0], 10) == []
    assert store.lookup([1, 1, 0], 10) == b1
    assert store.num_evicted == 1
    _store_prefix(store, [5, 5])  # evicts b1; b2 is pinned
    _store_prefix(store, [6, 6])  # evicts [4, 4]
    assert store.lookup([2, 2, 0], 10) == b2
    assert store.offer(None, [7, 7])[1] is not None  # an unpinned block is evicted for it
    store.check_invariants()


def test_everything_pinned_means_no_space():
    store = BlockStore(2, 2)
    blocks = _store_prefix(store, [1, 1, 2, 2])
    store.pin(blocks)
    assert store.offer(None, [3, 3])[1] is None
    store.unpin(blocks)
    assert store.offer(None, [3, 3])[1] is not None


def test_collision_guard_checks_tokens():
    store = BlockStore(4, 2, hash_fn=lambda parent, tokens: 42)  # every block collides
    _store_prefix(store, [1, 2])
    assert store.lookup([9, 9, 9], 10) == []
    assert len(store.lookup([1, 2, 9], 10)) == 1


def test_unpin_more_than_pinned_raises():
    store = BlockStore(2, 2)
    blocks = _store_prefix(store, [1, 1])
    with pytest.raises(RuntimeError):
        store.unpin(blocks)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def blocks_stored(self, blocks):
        self.events.append(("stored", [(b.key, b.parent, b.token_ids) for b in blocks]))

    def blocks_removed(self, keys):
        self.events.append(("removed", list(keys)))


def test_listener_hears_stored_chains_and_removals():
    store = BlockStore(3, 2)
    rec = _Recorder()
    store.add_listener(rec)
    k1 = store.block_keys([1, 1, 2, 2], 2)
    _store_prefix(store, [1, 1, 2, 2])
    assert rec.events == [("stored", [(k1[0], None, (1, 1)), (k1[1], k1[0], (2, 2))])]
    _store_prefix(store, [1, 1, 2, 2])  # already stored: nothing new
    assert len(rec.events) == 1
    key, block_id = store.offer(None, [7, 7])
    store.unpin([block_id])  # an offered block abandoned before commit was never visible: no event
    assert len(rec.events) == 1
    k3 = store.block_keys([3, 3, 4, 4], 2)
    _store_prefix(store, [3, 3, 4, 4])  # needs two blocks: one empty, then the LRU's oldest ([1, 1])
    assert rec.events[1] == ("removed", [k1[0]])
    assert rec.events[2] == ("stored", [(k3[0], None, (3, 3)), (k3[1], k3[0], (4, 4))])
    store.clear()
    assert rec.events[3][0] == "removed" and sorted(rec.events[3][1]) == sorted([k1[1], *k3])
    assert store.num_cached == 0
    store.check_invariants()


def test_listener_keys_match_lookup_chain():
    """The stored keys are the store's own chained keys: what a router needs as node ids."""
    store = BlockStore(8, 4)
    rec = _Recorder()
    store.add_listener(rec)
    tokens = list(range(10, 22))
    _store_prefix(store, tokens)
    ((_, blocks),) = rec.events
    assert [b[0] for b in blocks] == store.block_keys(tokens, 3)
    assert [b[1] for b in blocks] == [None, *store.block_keys(tokens, 2)]


def test_reserve_chain_pins_stored_blocks_and_offers_missing_ones():
    store = BlockStore(8, 4)
    a = list(range(100, 116))  # 4 blocks
    _store_prefix(store, a[:8])  # the first 2 are stored already
    keys = store.block_keys(a, 4)
    res = store.reserve_chain(keys, a)
    assert len(res.block_ids) == 4 and res.fill == (2, 3)
    assert store.num_pinned == 4
    assert len(store.lookup(a, 100)) == 2  # the offered ones are invisible until filled
    store.end_reservation(res, filled=True)
    assert store.num_pinned == 0 and len(store.lookup(a, 100)) == 4
    store.check_invariants()
    # a failed import gives the new blocks back and keeps the stored ones
    b = list(range(200, 212))
    _store_prefix(store, b[:4])
    res = store.reserve_chain(store.block_keys(b, 3), b)
    assert res.fill == (1, 2)
    store.end_reservation(res, filled=False)
    assert store.num_pinned == 0 and len(store.lookup(b, 100)) == 1
    store.check_invariants()


def test_reserve_chain_stops_when_every_block_is_pinned():
    store = BlockStore(2, 4)
    a = list(range(100, 112))
    res = store.reserve_chain(store.block_keys(a, 3), a)
    assert len(res.block_ids) == 2  # the chain is shorter: the rest is prefilled by the request itself
    store.end_reservation(res, filled=True)
    store.check_invariants()


def test_pin_prefix_pins_the_longest_stored_prefix():
    store = BlockStore(8, 4)
    a = list(range(100, 113))
    _store_prefix(store, a)
    ids = store.pin_prefix(store.block_keys(a, 3), a, len(a) - 1)
    assert len(ids) == 3 and store.num_pinned == 3
    store.unpin(ids)
    assert store.num_pinned == 0
