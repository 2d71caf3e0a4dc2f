"""The scheduler on a paged runner (runtime/scheduler.py with paged=True, the OpenVINO runner's mode): every block
of KV is one of the KV cache manager's, cached prefixes are shared by block table, a request's worst case is
reserved at admission. Driven with PagedFakeRunner, which reads every context through the plan's tables, so a
wrong table or a shared block overwritten gives a wrong token."""

from __future__ import annotations

import numpy as np
import pytest

from llmkiln.dynamo.kv_events import KvEventBridge, as_int64
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.scheduler import Scheduler, SchedulerConfig
from tests.runtime.conftest import (
    EOS,
    PagedFakeRunner,
    apply_plan,
    make_paged_scheduler,
    make_requests,
    reference_generate,
    run_to_completion,
)

BS = 4


def _runner(sched: Scheduler) -> PagedFakeRunner:
    assert sched.pool is not None
    return PagedFakeRunner(sched.config.scheduler.max_batch_size, sched.pool.num_blocks, BS)


def _settled(sched: Scheduler, runner: PagedFakeRunner) -> None:
    """Nothing runs: no pin, no reservation, and every stored block holds in the pool what the manager says."""
    pool = sched.pool
    assert pool is not None
    pool.check_invariants()
    assert pool.num_pinned == 0 and pool.num_reserved == 0
    for b in pool.blocks:
        if b.ready and b.key is not None:
            assert tuple(int(t) for t in runner.pool[b.block_id]) == b.token_ids, b


MODES = [
    {},
    {"chunked_prefill": False},
    {"ttft_first": True, "tpot_slo_ms": 1000.0},
    {"ttft_first": True, "tpot_slo_ms": 0.001},
    {"prefix_reuse": False},
]


@pytest.mark.parametrize(
    "mode", MODES, ids=["budget", "unchunked", "ttft-first", "ttft-decode-first", "no-reuse"]
)
def test_outputs_match_reference_with_sharing_and_evictions(mode):
    """Three system prompts, requests of varied lengths arriving in waves, a pool small enough to evict: every
    output equals the reference model's, and afterwards nothing is pinned or reserved."""
    sched = make_paged_scheduler(num_blocks=60, max_seq_len=256, **mode)  # 4 worst cases do not fit
    runner = _runner(sched)
    rng = np.random.default_rng(5)
    systems = [[int(x) for x in rng.integers(3, 97, n)] for n in (18, 33, 9)]
    expected: dict[str, list[int]] = {}
    outputs: dict[str, list[int | None]] = {}
    step = 0
    for wave in range(6):
        for i, r in enumerate(make_requests(5, prompt_len=int(rng.integers(1, 30)), max_tokens=7, seed=wave)):
            r.prompt_ids = systems[(wave + i) % 3] + r.prompt_ids
            expected[r.request_id] = reference_generate(r.prompt_ids, 7)
            sched.add_request(r)
        for _ in range(int(rng.integers(1, 12))):
            if not sched.has_work():
                break
            plan = sched.schedule(now_ns=step)
            for req, ev in apply_plan(sched, runner, plan, now_ns=step):
                outputs.setdefault(req.request_id, []).append(ev.token_id)
            step += 1
            assert sched.pool is not None
            sched.pool.check_invariants()
    for rid, toks in run_to_completion(sched, runner).items():
        outputs.setdefault(rid, []).extend(toks)
    assert outputs == expected
    assert all(not plan.loads for plan in runner.steps)
    if sched.block_store is not None:
        assert sched.block_store.num_hits > 0
        assert sched.block_store.num_evicted > 0
    _settled(sched, runner)


def test_a_cached_prefix_is_shared_by_block_table_not_copied():
    sched = make_paged_scheduler()
    runner = _runner(sched)
    system = list(range(10, 22))  # 3 whole blocks
    first, second = make_requests(2, prompt_len=5, max_tokens=3, prefix=system)
    sched.add_request(first)
    run_to_completion(sched, runner)
    sched.add_request(second)
    plan = sched.schedule()
    table = plan.block_tables[second.request_id]
    assert second.num_cached_tokens == 12
    shared = [b.block_id for b in sched.pool.blocks if b.key in set(second.block_hashes[:3])]  # type: ignore[union-attr]
    assert list(table[:3]) == sorted(shared, key=lambda b: list(table).index(b))
    assert [sched.pool.blocks[b].ref_count for b in table[:3]] == [1, 1, 1]  # type: ignore[union-attr]
    assert plan.prefills[0].start == 12 and not plan.loads
    apply_plan(sched, runner, plan)
    run_to_completion(sched, runner)
    _settled(sched, runner)


def test_cancel_mid_prompt_gives_every_block_back():
    sched = make_paged_scheduler(max_prefill_tokens=8)
    runner = _runner(sched)
    (r,) = make_requests(1, prompt_len=30, max_tokens=4)
    sched.add_request(r)
    apply_plan(sched, runner, sched.schedule())  # 8 of 30 prompt tokens
    assert r.pinned_block_ids and r.reserved_blocks > 0
    sched.abort(r.request_id)
    _settled(sched, runner)
    (again,) = make_requests(1, prompt_len=30, max_tokens=4)
    again.prompt_ids = list(r.prompt_ids)
    sched.add_request(again)
    assert run_to_completion(sched, runner)[again.request_id] == reference_generate(r.prompt_ids, 4)
    _settled(sched, runner)


def test_admission_waits_for_blocks_instead_of_running_out():
    """A pool that holds one request's worst case: the second waits for the first to end, then runs."""
    sched = make_paged_scheduler(num_blocks=9, max_seq_len=256, prefix_reuse=False)
    runner = _runner(sched)
    a, b = make_requests(2, prompt_len=20, max_tokens=16)  # 36 tokens: 9 blocks of 4
    sched.add_request(a)
    sched.add_request(b)
    plan = sched.schedule()
    assert [c.request_id for c in plan.prefills] == [a.request_id]
    apply_plan(sched, runner, plan)
    out = run_to_completion(sched, runner)
    assert out[b.request_id] == reference_generate(b.prompt_ids, 16)
    _settled(sched, runner)


class _Router:
    """What Dynamo's KV router keeps of one worker from its KV events: the set of block hashes."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def publish_stored(self, token_ids, num_block_tokens, block_hashes, parent_hash=None) -> None:
        self.blocks.update(block_hashes)

    def publish_removed(self, block_hashes) -> None:
        self.blocks.difference_update(block_hashes)


def test_the_routers_view_is_what_the_worker_holds():
    """The engine on a paged runner, its manager's events through the Dynamo bridge: after a mixed workload with
    evictions the router's set of blocks is exactly the blocks the worker's KV holds."""
    config = SchedulerConfig.make(
        eos_token_ids=(EOS,),
        max_batch_size=4,
        max_num_tokens=64,
        max_prefill_tokens=16,
        tokens_per_block=BS,
        max_input_len=96,
        max_seq_len=128,
    )
    runner = PagedFakeRunner(4, 60, BS)  # 4 requests of up to 14 blocks, a few cached ones beside
    engine = LLMEngine(config, runner)
    assert engine.block_store is engine.kv_manager
    bridge = KvEventBridge()
    assert engine.block_store is not None
    engine.block_store.add_listener(bridge)
    router = _Router()
    rng = np.random.default_rng(9)
    systems = [[int(x) for x in rng.integers(3, 97, n)] for n in (24, 40, 13, 31)]
    with engine.start():
        for _ in range(5):
            prompts = [
                systems[int(rng.integers(0, 4))] + [int(x) for x in rng.integers(3, 97, 9)] for _ in range(6)
            ]
            handles = [engine.submit(p, SamplingParams(max_tokens=5, ignore_eos=True)) for p in prompts]
            for p, h in zip(prompts, handles, strict=True):
                assert h.result(timeout=30) == reference_generate(p, 5)
        store = engine.block_store
        held = engine.call(lambda: {as_int64(b.key) for b in store.blocks if b.ready and b.key is not None})
        held_now = held.result(timeout=10)
    bridge.start(router)
    bridge.close()
    assert store.num_evicted > 0
    assert router.blocks == held_now


def test_a_prompt_leaving_a_cached_chain_inside_a_block_copies_that_blocks_head():
    """Copy-on-write: the second prompt shares 10 tokens with the first (2 whole blocks of 4 and 2 tokens of the
    third): the third block is copied into its own and its prefill starts at token 10; the output is exact."""
    sched = make_paged_scheduler()
    runner = _runner(sched)
    system = list(range(10, 20))  # 10 tokens
    first = make_requests(1, prompt_len=6, max_tokens=3, prefix=system, seed=1)[0]
    second = make_requests(1, prompt_len=6, max_tokens=3, prefix=system, seed=2)[0]
    assert first.prompt_ids[10] != second.prompt_ids[10]
    sched.add_request(first)
    run_to_completion(sched, runner)
    sched.add_request(second)
    plan = sched.schedule()
    assert len(plan.copies) == 1
    src, dst = plan.copies[0]
    assert sched.pool is not None and sched.pool.blocks[src].token_ids[:2] == tuple(system[8:10])
    assert plan.block_tables[second.request_id][2] == dst != src
    assert second.num_cached_tokens == 10 and plan.prefills[0].start == 10
    out = {second.request_id: []}
    for req, ev in apply_plan(sched, runner, plan):
        out[req.request_id].append(ev.token_id)
    for rid, toks in run_to_completion(sched, runner).items():
        out[rid] += toks
    assert out[second.request_id] == reference_generate(second.prompt_ids, 3)
    _settled(sched, runner)
