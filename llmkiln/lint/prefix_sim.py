"""The hit rate the runtime's prefix store reaches on a request sequence, computed without running a model.

It follows `runtime/scheduler.py` and `runtime/kv_blocks.py` step by step:
- a request looks up at most `prompt_len - 1` tokens (`Scheduler._lookup`: the last prompt token is always
  computed, it produces the first output token), in whole blocks of `tokens_per_block`, with the block store's
  own chained keys (`kv_blocks.hash_block_tokens`), stopping at the first block not stored;
- after its prefill every *full* prompt block is stored (`Scheduler._plan_saves`; generated tokens never are);
- a prompt longer than `limits.max_input_len` is rejected before any lookup (not counted).
Assumptions (say them wherever the number is shown): requests arrive one after another in file order, each
finishing its prefill before the next is looked up, and the store is unbounded (no LRU eviction). The runtime
reaches exactly this rate when the requests are served sequentially and the store's byte budget holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmkiln.runtime.kv_blocks import hash_block_tokens


@dataclass(frozen=True)
class HitResult:
    """Cached tokens per request (None: rejected as too long) and the totals the runtime's metrics report."""

    cached: list[int | None]
    prompt_tokens: list[int]
    tokens_per_block: int
    distinct_blocks: int

    @property
    def looked_up_tokens(self) -> int:
        return sum(n for n, c in zip(self.prompt_tokens, self.cached, strict=True) if c is not None)

    @property
    def hit_tokens(self) -> int:
        return sum(c for c in self.cached if c)

    @property
    def token_hit_rate(self) -> float:
        """Hit tokens / prompt tokens looked up: the runtime's prefix_cache_token_hit_rate."""
        total = self.looked_up_tokens
        return self.hit_tokens / total if total else 0.0

    @property
    def request_hit_rate(self) -> float:
        """Requests with at least one cached block / requests looked up: the runtime's prefix_cache_hit_rate."""
        looked = [c for c in self.cached if c is not None]
        return sum(1 for c in looked if c) / len(looked) if looked else 0.0

    @property
    def num_rejected(self) -> int:
        return sum(1 for c in self.cached if c is None)


def simulate_hits(
    prompts: Sequence[Sequence[int]], tokens_per_block: int, max_input_len: int | None = None
) -> HitResult:
    """Cached tokens of each prompt when served in order through an unbounded prefix store."""
    bs = tokens_per_block
    store: dict[
        int, tuple[int | None, tuple[int, ...]]
    ] = {}  # key -> (parent key, token ids): collision guard
    cached: list[int | None] = []
    for ids in prompts:
        n = len(ids)
        if n == 0 or (max_input_len is not None and n > max_input_len):
            cached.append(None)
            continue
        parent: int | None = None
        hits = 0
        for i in range((n - 1) // bs):
            block = tuple(ids[i * bs : (i + 1) * bs])
            key = hash_block_tokens(parent, block)
            if store.get(key) != (parent, block):
                break
            hits += 1
            parent = key
        cached.append(hits * bs)
        for i in range(hits, n // bs):  # the full prompt blocks this request stores
            block = tuple(ids[i * bs : (i + 1) * bs])
            key = hash_block_tokens(parent, block)
            store.setdefault(key, (parent, block))
            parent = key
    return HitResult(cached, [len(p) for p in prompts], bs, len(store))
