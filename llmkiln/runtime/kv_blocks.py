"""The KV cache manager: every block's id, chained hash, reference count (pins), LRU eviction, a fixed capacity.

Pure Python: this module decides which block ids hold which token prefixes; the runner owns the memory the ids
index (a slot runner's prefix store, kv_quant.BlockData; a paged runner's pools, runtime.paged_pool). On a paged
runner (OpenVINO) every block of KV is one of these, a running sequence's block table included: the scheduler
`reserve`s a request's worst case at admission, `allocate`s private blocks and `offer`s prompt blocks as the
sequence grows into them, and shares cached prefixes by pinning them into the table — no second pool, no copies.
No write ever lands in a shared block (hits are whole blocks and a request always computes its last prompt
token into a block of its own); a prompt that diverges *inside* a stored block takes that block's first tokens by
copy-on-write instead (`partial_match`: the stored child of its last hit with the longest common prefix is copied
into the request's own block, which it then writes from there). A block holds the KV of `tokens_per_block`
consecutive tokens. Its key chains the
key of the block before it with its own token ids, so a key stands for the whole prefix up to the block's end
(nano-vllm / vLLM). Only full blocks are keyed; a hit is accepted only when the stored token ids and parent key
match (collision guard).

Life of a block: empty → `allocate()` hands it out pinned, unkeyed (a sequence's private block: back to empty when
unpinned), or `offer()` hands it out pinned and not ready (the engine writes it once the step's
tokens are out) → `commit()` makes it ready and unpins it → lookups pin it while a running sequence uses it → when no sequence
pins it, it sits in the LRU and keeps its key until `offer()` needs the space (evicted).

Listeners (`add_listener`) hear when blocks become visible (`commit`: each block's key, parent key and tokens, in
chain order) and when keyed blocks leave the store (eviction by `offer`, `clear`). A KV-aware router mirrors a
worker's store from these (llmkiln.dynamo.kv_events). They run on the thread that changes the store (the
engine's scheduler thread): keep them short, e.g. put the events on a queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

HashFn = Callable[[int | None, tuple[int, ...]], int]

_ROOT = 0x6B696C6E  # fixed seed for the first block's parent


def hash_block_tokens(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """Key of a block: covers the parent's key and this block's token ids. Deterministic across processes
    (hash() of ints and tuples does not depend on PYTHONHASHSEED)."""
    return hash((_ROOT if parent is None else parent, token_ids))


@dataclass
class Block:
    """One block slot of the store."""

    block_id: int
    key: int | None = None
    parent: int | None = None
    token_ids: tuple[int, ...] = ()
    ref_count: int = 0
    ready: bool = False


@dataclass(frozen=True)
class StoredBlock:
    """A block that became visible to lookups: its chained key, its parent's key (None: first block), its tokens."""

    key: int
    parent: int | None
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Reservation:
    """Blocks of a chain held for an import (`BlockStore.reserve_chain`): all pinned; `fill` are the positions
    among `block_ids` whose contents come from elsewhere (offered, not ready)."""

    block_ids: tuple[int, ...]
    fill: tuple[int, ...]

    @property
    def fill_ids(self) -> list[int]:
        return [self.block_ids[i] for i in self.fill]


class BlockListener(Protocol):
    """Hears the store's changes (see the module docstring)."""

    def blocks_stored(self, blocks: Sequence[StoredBlock]) -> None: ...

    def blocks_removed(self, keys: Sequence[int]) -> None: ...


class BlockStore:
    """Metadata of `num_blocks` blocks of `tokens_per_block` tokens; LRU over blocks no sequence pins."""

    def __init__(self, num_blocks: int, tokens_per_block: int, hash_fn: HashFn = hash_block_tokens) -> None:
        if num_blocks < 0 or tokens_per_block < 1:
            raise ValueError(f"num_blocks={num_blocks}, tokens_per_block={tokens_per_block}")
        self.tokens_per_block = tokens_per_block
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._by_key: dict[int, int] = {}
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._lru: OrderedDict[int, None] = OrderedDict()  # ready, unpinned, keyed blocks; oldest first
        self._children: dict[int | None, set[int]] = {}  # parent key -> ready blocks chained to it
        self.num_evicted = 0
        self._reserved = 0  # blocks promised to running sequences (`reserve`), not handed out yet
        self.num_lookups = 0
        self.num_hits = 0
        self.num_hit_tokens = 0
        self.num_queried_tokens = 0
        self._listeners: list[BlockListener] = []

    def add_listener(self, listener: BlockListener) -> None:
        """Report stored and removed blocks to `listener` from now on."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_pinned(self) -> int:
        return sum(1 for b in self.blocks if b.ref_count > 0)

    @property
    def num_cached(self) -> int:
        """Blocks holding a keyed prefix (pinned or not)."""
        return len(self._by_key)

    @property
    def num_free(self) -> int:
        """Blocks not pinned: empty ones plus cached ones no sequence pins (reserved ones included)."""
        return len(self._empty) + len(self._lru)

    @property
    def num_reserved(self) -> int:
        return self._reserved

    @property
    def num_available(self) -> int:
        """Free blocks nobody has reserved: what `reserve`, and an `offer` or `allocate` without a reservation,
        may take."""
        return self.num_free - self._reserved

    # ------------------------------------------------------------------ reservations (paged runners)
    def reserve(self, num_blocks: int) -> bool:
        """Promise `num_blocks` future blocks to a sequence (its worst case); False when that many are not
        available. Each `allocate`/`offer` with reserved=True consumes one; `unreserve` returns the rest."""
        if num_blocks < 0:
            raise ValueError(f"reserve({num_blocks})")
        if num_blocks > self.num_available:
            return False
        self._reserved += num_blocks
        return True

    def unreserve(self, num_blocks: int) -> None:
        if not 0 <= num_blocks <= self._reserved:
            raise RuntimeError(f"unreserve({num_blocks}) with {self._reserved} reserved")
        self._reserved -= num_blocks

    def allocate(self, reserved: bool = False) -> int | None:
        """A private block (pinned, unkeyed: never looked up; back to empty when unpinned), or None when no block
        is available. reserved=True takes it out of a `reserve`d promise."""
        block_id = self._take(reserved)
        if block_id is not None:
            self.blocks[block_id].ref_count = 1
        return block_id

    def block_keys(self, token_ids: Sequence[int], num_blocks: int, parent: int | None = None) -> list[int]:
        """Chained keys of the first `num_blocks` full blocks of token_ids."""
        keys, bs = [], self.tokens_per_block
        for i in range(num_blocks):
            parent = self.hash_fn(parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            keys.append(parent)
        return keys

    def lookup(self, token_ids: Sequence[int], max_tokens: int, record: bool = True) -> list[int]:
        """Block ids of the longest cached prefix of token_ids covering at most max_tokens tokens (not pinned).

        record=False leaves the hit statistics alone (call `record_lookup` once the result is used)."""
        n_max = max(0, min(len(token_ids), max_tokens)) // self.tokens_per_block
        found = self.lookup_keys(self.block_keys(token_ids, n_max), token_ids, max_tokens)
        if record:
            self.record_lookup(len(token_ids), len(found) * self.tokens_per_block)
        return found

    def lookup_keys(self, keys: Sequence[int], token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """`lookup` with the chained keys computed already (a request keeps its block hashes): block ids of the
        longest cached prefix covering at most max_tokens tokens; no statistics recorded, nothing pinned."""
        bs = self.tokens_per_block
        n_max = min(len(keys), max(0, min(len(token_ids), max_tokens)) // bs)
        found: list[int] = []
        parent: int | None = None
        for i in range(n_max):
            block_id = self._stored(keys[i], parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            if block_id is None:
                break
            found.append(block_id)
            parent = keys[i]
        return found

    def partial_match(
        self, parent: int | None, token_ids: Sequence[int], max_candidates: int = 256
    ) -> tuple[int | None, int]:
        """(block id, n): the ready block chained to `parent` whose first n tokens equal token_ids' first n, n the
        longest among at most max_candidates such blocks (n = 0: none). What copy-on-write takes: a prompt that
        leaves a stored chain inside a block can start n tokens further on a copy of it."""
        best, best_n = None, 0
        want = tuple(token_ids)
        for i, block_id in enumerate(self._children.get(parent, ())):
            if i >= max_candidates or best_n == len(want):
                break
            have = self.blocks[block_id].token_ids
            n = 0
            for a, b in zip(have, want, strict=False):
                if a != b:
                    break
                n += 1
            if n > best_n:
                best, best_n = block_id, n
        return best, best_n

    def _stored(self, key: int, parent: int | None, tokens: tuple[int, ...]) -> int | None:
        """The ready block holding exactly this chain link (collision guard: its tokens and parent match)."""
        block_id = self._by_key.get(key)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if not block.ready or block.token_ids != tokens or block.parent != parent:
            return None
        return block_id

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one lookup of num_tokens prompt tokens of which num_hit_tokens were served from cache (whole
        blocks here; the scheduler also counts the prefix a slot still holds beyond them)."""
        self.num_lookups += 1
        self.num_queried_tokens += num_tokens
        if num_hit_tokens:
            self.num_hits += 1
            self.num_hit_tokens += num_hit_tokens

    # ------------------------------------------------------------------ hand-off (prefill/decode separation)
    def pin_prefix(self, keys: Sequence[int], token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """The longest cached prefix (`lookup_keys`), pinned: the caller unpins it (an export's blocks stay put
        while another process reads them)."""
        found = self.lookup_keys(keys, token_ids, max_tokens)
        self.pin(found)
        return found

    def reserve_chain(self, keys: Sequence[int], token_ids: Sequence[int]) -> Reservation:
        """Room for the chain of blocks `keys` (of token_ids), to be filled from elsewhere (an import):
        the block ids, in chain order, all pinned, and the positions among them to fill. A block already stored and
        ready is pinned as it is (nothing to fill); a missing one is offered (pinned, not ready: fill it, then
        `commit` it, or `unpin` it to give it back). Stops at the first block that can be neither (being written
        by a step, or every block pinned): the chain is shorter then."""
        bs = self.tokens_per_block
        ids: list[int] = []
        fill: list[int] = []
        parent: int | None = None
        for i, key in enumerate(keys):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            if key in self._by_key:
                existing = self._stored(key, parent, tokens)
                if existing is None:  # being written, or another chain's
                    break
                self.pin([existing])
                ids.append(existing)
            else:
                _, block_id = self.offer(parent, tokens, key=key)
                if block_id is None:
                    break
                fill.append(len(ids))
                ids.append(block_id)
            parent = key
        return Reservation(tuple(ids), tuple(fill))

    def end_reservation(self, reservation: Reservation, filled: bool) -> None:
        """The import is over: filled, its new blocks become visible (`commit`) and every pin is released;
        otherwise the new blocks go back to the free list and the stored ones are unpinned."""
        fill = set(reservation.fill)
        new = reservation.fill_ids
        kept = [b for i, b in enumerate(reservation.block_ids) if i not in fill]
        if filled and new:
            self.commit(new)
        elif new:
            self.unpin(new)
        if kept:
            self.unpin(kept)

    # ------------------------------------------------------------------ pins
    def pin(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            block = self.blocks[block_id]
            block.ref_count += 1
            self._lru.pop(block_id, None)

    def unpin(self, block_ids: Sequence[int]) -> None:
        """Release pins; released blocks enter the LRU tail-first so a chain's last blocks are evicted first."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} unpinned more often than pinned")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.ready and block.key is not None:
                    self._lru[block_id] = None
                    self._lru.move_to_end(block_id)
                else:  # an offered block whose write was abandoned
                    self._forget(block)
                    self._empty.append(block_id)

    # ------------------------------------------------------------------ saving
    def offer(
        self, parent: int | None, token_ids: Sequence[int], key: int | None = None, reserved: bool = False
    ) -> tuple[int, int | None]:
        """A full block of a sequence is computed (slot runners), or about to be (paged runners: the sequence
        writes its KV straight into it). Returns (its key, block id to write or None); `key`: the block's chained
        key when the caller computed it already (it must equal hash_fn(parent, token_ids)); reserved: take the
        block out of a `reserve`d promise.

        None when the prefix is stored already (or being written) or when no block is available. A returned block
        is pinned and not ready: the runner writes it, then `commit()` publishes it.
        """
        tokens = tuple(token_ids)
        if len(tokens) != self.tokens_per_block:
            raise ValueError(
                f"offer() takes full blocks of {self.tokens_per_block} tokens, got {len(tokens)}"
            )
        if key is None:
            key = self.hash_fn(parent, tokens)
        existing = self._by_key.get(key)
        if existing is not None:
            if existing in self._lru:
                self._lru.move_to_end(existing)
            return key, None
        block_id = self._take(reserved)
        if block_id is None:
            return key, None
        block = self.blocks[block_id]
        block.key, block.parent, block.token_ids, block.ready, block.ref_count = key, parent, tokens, False, 1
        self._by_key[key] = block_id
        return key, block_id

    def commit(self, block_ids: Sequence[int]) -> None:
        """The runner wrote these offered blocks: make them visible to lookups and unpin them."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            block.ready = True
            if block.key is not None:
                self._children.setdefault(block.parent, set()).add(block_id)
        if self._listeners and block_ids:
            stored = []
            for block_id in block_ids:
                b = self.blocks[block_id]
                if b.key is not None:
                    stored.append(StoredBlock(b.key, b.parent, b.token_ids))
            for listener in self._listeners:
                listener.blocks_stored(stored)
        self.unpin(block_ids)

    def _take(self, reserved: bool = False) -> int | None:
        if reserved:
            if self._reserved <= 0:
                raise RuntimeError("a reserved block was taken beyond the reservation")
            self._reserved -= 1
        elif self.num_available <= 0:
            return None
        if self._empty:
            return self._empty.pop()
        if self._lru:
            block_id, _ = self._lru.popitem(last=False)
            key = self.blocks[block_id].key
            self._forget(self.blocks[block_id])
            self.num_evicted += 1
            self._removed([key] if key is not None else [])
            return block_id
        return None

    def _removed(self, keys: list[int]) -> None:
        if keys:
            for listener in self._listeners:
                listener.blocks_removed(keys)

    def _forget(self, block: Block) -> None:
        siblings = self._children.get(block.parent)
        if siblings is not None:
            siblings.discard(block.block_id)
            if not siblings:
                del self._children[block.parent]
        if block.key is not None and self._by_key.get(block.key) == block.block_id:
            del self._by_key[block.key]
        block.key, block.parent, block.token_ids, block.ready = None, None, (), False

    def clear(self) -> None:
        """Drop every unpinned cached block (pinned ones stay)."""
        removed = []
        for block_id in list(self._lru):
            self._lru.pop(block_id)
            key = self.blocks[block_id].key
            if key is not None:
                removed.append(key)
            self._forget(self.blocks[block_id])
            self._empty.append(block_id)
        self._removed(removed)

    def check_invariants(self) -> None:
        """Raise AssertionError-free RuntimeError if bookkeeping is inconsistent (used by tests)."""
        pinned = {b.block_id for b in self.blocks if b.ref_count > 0}
        empty, lru = set(self._empty), set(self._lru)
        if len(empty) != len(self._empty) or empty & lru or empty & pinned or lru & pinned:
            raise RuntimeError("block lists overlap")
        if self._reserved > len(empty) + len(lru):
            raise RuntimeError(f"{self._reserved} blocks reserved, {len(empty) + len(lru)} free")
        if len(empty) + len(lru) + len(pinned) != self.num_blocks:
            raise RuntimeError(
                f"empty {len(empty)} + lru {len(lru)} + pinned {len(pinned)} != total {self.num_blocks}"
            )
        for key, block_id in self._by_key.items():
            if self.blocks[block_id].key != key:
                raise RuntimeError(f"key map points at block {block_id} with another key")
