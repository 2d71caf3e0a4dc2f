"""The simulation hits exactly what the runtime's BlockStore hits when driven like the scheduler drives it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmkiln.lint.prefix_sim import simulate_hits
from llmkiln.runtime.kv_blocks import BlockStore


def _block_store_hits(prompts: list[list[int]], bs: int) -> list[int]:
    """Lookup at most len-1 tokens (Scheduler._lookup), then offer + commit every full prompt block."""
    store = BlockStore(10_000, bs)
    out = []
    for ids in prompts:
        hits = store.lookup(ids, len(ids) - 1)
        out.append(len(hits) * bs)
        parent = store.blocks[hits[-1]].key if hits else None
        offered = []
        for i in range(len(hits), len(ids) // bs):
            parent, block_id = store.offer(parent, ids[i * bs : (i + 1) * bs])
            if block_id is not None:
                offered.append(block_id)
        store.commit(offered)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=12),
    st.sampled_from([1, 2, 4, 8]),
)
def test_simulation_matches_the_block_store(prompts: list[list[int]], bs: int) -> None:
    assert simulate_hits(prompts, bs).cached == _block_store_hits(prompts, bs)


def test_last_token_is_never_looked_up_and_long_prompts_are_rejected() -> None:
    a = list(range(32))
    r = simulate_hits([a, a, a + [99]], 16)
    assert r.cached == [0, 16, 32]  # the repeat reuses one block, not two: its last token must be computed
    r = simulate_hits([a, a + [1] * 40], 16, max_input_len=50)
    assert r.cached == [0, None] and r.num_rejected == 1 and r.looked_up_tokens == 32
