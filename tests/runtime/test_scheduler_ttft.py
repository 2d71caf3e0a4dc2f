"""TTFT-first scheduling (scheduler.ttft_first, tpot_slo_ms) with the fake runner: decisions, not timings.

Time is passed in explicitly (now_ns, the engine's StepCosts), so every decision below is deterministic.
"""

from __future__ import annotations

import pytest

from llmkiln.errors import RecipeError
from llmkiln.recipe import load_recipe
from llmkiln.runtime.plan import StepCosts

from .conftest import FakeRunner, apply_plan, make_requests, make_scheduler, reference_generate

MS = 1_000_000


def _sched(**kw):
    base = dict(
        ttft_first=True, tpot_slo_ms=100.0, max_batch_size=4, max_prefill_tokens=32, max_num_tokens=64
    )
    base.update(kw)
    return make_scheduler(**base)


def _runner(sched) -> FakeRunner:
    blocks = sched.block_store.num_blocks if sched.block_store is not None else 0
    return FakeRunner(sched.config.scheduler.max_batch_size, blocks, 4)


def _step(sched, runner, now_ns, costs=None):
    plan = sched.schedule(now_ns, costs or StepCosts())
    events = apply_plan(sched, runner, plan, now_ns)
    return plan, events


def _kind(plan) -> str:
    assert not (plan.prefills and plan.decodes), "a TTFT-first step is one prefill run or one decode batch"
    return "prefill" if plan.prefills else "decode" if plan.decodes else "empty"


def test_outputs_match_reference_with_ttft_first():
    for chunked in (True, False):
        for reuse in (True, False):
            sched = _sched(chunked_prefill=chunked, prefix_reuse=reuse, tpot_slo_ms=0.001)
            reqs = make_requests(7, prompt_len=23, max_tokens=6, prefix=list(range(3, 15)), seed=1)
            for r in reqs:
                sched.add_request(r)
            runner = _runner(sched)
            outputs = {}
            for step in range(1000):
                if not sched.has_work():
                    break
                plan, events = _step(sched, runner, step * MS, StepCosts(1 * MS, 5 * MS))
                _kind(plan)
                for request, ev in events:
                    outputs.setdefault(request.request_id, []).append(ev.token_id)
            for r in reqs:
                assert outputs[r.request_id] == reference_generate(r.prompt_ids, 6), (chunked, reuse)
            assert sched.num_running == 0
            assert sched.block_store is None or sched.block_store.num_pinned == 0


def test_waiting_prompt_runs_before_decodes_while_tpot_allows():
    sched = _sched(tpot_slo_ms=1000.0)
    a, b = make_requests(2, prompt_len=10, max_tokens=20)
    runner = _runner(sched)
    sched.add_request(a)
    _step(sched, runner, 0)  # a's prefill: its first token at t=0
    sched.add_request(b)
    plan, _ = _step(sched, runner, 10 * MS, StepCosts(2 * MS, 20 * MS))
    assert _kind(plan) == "prefill" and plan.admitted == [b.request_id]  # projected TPOT of a: 50 ms ≤ 1000


def test_decode_goes_first_when_a_running_request_would_miss_the_tpot_bound():
    sched = _sched(tpot_slo_ms=40.0)
    a, b = make_requests(2, prompt_len=10, max_tokens=20)
    runner = _runner(sched)
    sched.add_request(a)
    _step(sched, runner, 0)
    sched.add_request(b)
    # a's next token after b's prefill (10 tokens x 2 ms) and a decode (20 ms): 10 + 20 + 20 = 50 ms > 40 ms
    plan, _ = _step(sched, runner, 10 * MS, StepCosts(2 * MS, 20 * MS))
    assert _kind(plan) == "decode" and [d.request_id for d in plan.decodes] == [a.request_id]
    assert b.status.value == "waiting"
    # after a forced decode the prompt goes next, even though a would still miss the bound (no starvation)
    plan, _ = _step(sched, runner, 11 * MS, StepCosts(2 * MS, 20 * MS))
    assert _kind(plan) == "prefill" and plan.admitted == [b.request_id]


def test_tpot_is_the_mean_over_a_requests_tokens():
    sched = _sched(tpot_slo_ms=40.0)
    a, b = make_requests(2, prompt_len=10, max_tokens=50)
    runner = _runner(sched)
    sched.add_request(a)
    _step(sched, runner, 0)
    for i in range(1, 10):  # nine quick decodes, 1 ms apart: a banks slack under its 40 ms mean
        assert _kind(_step(sched, runner, i * MS)[0]) == "decode"
    sched.add_request(b)
    # as in the test above, a's next token would come at 10 + 10 x 2 + 20 = 50 ms, but a has 10 tokens now:
    # 50 ms over 10 intervals = 5 ms mean ≤ 40 ms, so the prompt goes first
    plan, _ = _step(sched, runner, 10 * MS, StepCosts(2 * MS, 20 * MS))
    assert _kind(plan) == "prefill"


def test_one_run_per_step_for_prompts_with_a_cached_prefix():
    sched = _sched(tpot_slo_ms=1e6)
    prefix = list(range(10, 22))  # 3 blocks of 4
    first, *rest = make_requests(4, prompt_len=6, prefix=prefix, max_tokens=3, seed=2)
    runner = _runner(sched)
    sched.add_request(first)
    _step(sched, runner, 0)
    for r in rest:
        sched.add_request(r)
    seen = []
    for i in range(3):
        plan, _ = _step(sched, runner, (i + 1) * MS)
        assert _kind(plan) == "prefill" and len(plan.prefills) == 1 and plan.prefills[0].start == 12
        seen += plan.admitted
    assert seen == [r.request_id for r in rest]  # arrival order, one each


def test_fresh_prompts_are_batched_into_one_run():
    sched = _sched(prefix_reuse=False, max_prefill_tokens=32)
    reqs = make_requests(5, prompt_len=10, max_tokens=2)
    for r in reqs:
        sched.add_request(r)
    plan, _ = _step(sched, _runner(sched), 0)
    # three 10-token prompts fit the 32-token prefill budget; a 4th slot is free but over budget
    assert plan.admitted == [r.request_id for r in reqs[:3]]
    assert all(c.start == 0 and c.sample for c in plan.prefills)


def test_single_chunk_prompts_go_before_multi_chunk_ones():
    sched = _sched(prefix_reuse=False, max_prefill_tokens=16, max_num_tokens=32)
    (long,) = make_requests(1, prompt_len=60, max_tokens=2, seed=5)
    (short,) = make_requests(1, prompt_len=8, max_tokens=2, seed=6)
    runner = _runner(sched)
    sched.add_request(long)
    plan, _ = _step(sched, runner, 0)
    assert plan.admitted == [long.request_id] and not plan.prefills[0].sample  # its first chunk
    sched.add_request(short)
    plan, _ = _step(sched, runner, MS)
    assert [c.request_id for c in plan.prefills] == [short.request_id]  # overtakes the long prompt's rest
    plan, _ = _step(sched, runner, 2 * MS, StepCosts(MS, MS))
    assert [c.request_id for c in plan.prefills] == [long.request_id]


def test_a_prompt_just_over_one_chunk_overtakes_a_long_prompts_rest():
    """Fewest chunks left first: a 20-token prompt (2 chunks of 16) runs before the 3 chunks left of a 60-token
    prompt, instead of waiting for all of them (the prefill tier's 129-token prompts behind 2048-token ones)."""
    sched = _sched(prefix_reuse=False, max_prefill_tokens=16, max_num_tokens=32)
    (long,) = make_requests(1, prompt_len=60, max_tokens=2, seed=5)
    (mid,) = make_requests(1, prompt_len=20, max_tokens=2, seed=7)
    runner = _runner(sched)
    sched.add_request(long)
    _step(sched, runner, 0)  # the long prompt's first chunk: 44 tokens (3 chunks) left
    sched.add_request(mid)
    order = []
    for i in range(1, 6):
        plan, _ = _step(sched, runner, i * MS, StepCosts(MS, MS))
        order += [c.request_id for c in plan.prefills]
    assert order == [mid.request_id] * 2 + [long.request_id] * 3


def test_prefill_runs_are_capped_only_while_sequences_decode():
    """max_prefill_tokens_decoding bounds a run while something decodes; an idle engine batches a burst of fresh
    prompts up to max_prefill_tokens in one run (the decode tier's local prefills)."""
    sched = _sched(prefix_reuse=False, max_prefill_tokens=32, max_prefill_tokens_decoding=8)
    burst = make_requests(3, prompt_len=8, max_tokens=4, seed=9)
    runner = _runner(sched)
    for r in burst:
        sched.add_request(r)
    plan, _ = _step(sched, runner, 0)
    assert sorted(c.request_id for c in plan.prefills) == sorted(r.request_id for r in burst)  # one run of 24
    (late,) = make_requests(1, prompt_len=20, max_tokens=2, seed=10)
    sched.add_request(late)
    plan, _ = _step(sched, runner, MS, StepCosts(MS, MS))
    assert [(c.request_id, len(c.token_ids)) for c in plan.prefills] == [
        (late.request_id, 8)
    ]  # capped: 3 decode
    with pytest.raises(ValueError, match="max_prefill_tokens_decoding"):
        _sched(max_prefill_tokens=32, max_prefill_tokens_decoding=64)


def test_recipe_rejects_ttft_first_with_static_batching():
    with pytest.raises(RecipeError, match="ttft_first"):
        load_recipe("tiny-fp32", {"scheduler": {"batching": "static", "ttft_first": True}})
    with pytest.raises(RecipeError, match="tpot_slo_ms"):
        load_recipe("tiny-fp32", {"scheduler": {"tpot_slo_ms": 0}})
    recipe, _ = load_recipe("tiny-fp32", {"scheduler": {"ttft_first": True, "tpot_slo_ms": 50}})
    assert recipe.scheduler.ttft_first and recipe.scheduler.tpot_slo_ms == 50.0


def test_prefills_with_a_past_batch_when_the_runner_can():
    """A runner that batches prompts on a past (torch path): the waiting prompts that hit the cached prefix go
    in one run (up to max_prefill_tokens); without the capability each runs alone (GroupQueryAttention)."""
    prefix = list(range(3, 19))  # 4 blocks of 4
    for capable, expected in ((False, [1, 1, 1]), (True, [3])):
        sched = _sched(max_prefill_tokens=32, prefix_reuse=True)
        sched.batch_past_prefills = capable
        runner = _runner(sched)
        warm = make_requests(1, prompt_len=5, max_tokens=1, prefix=prefix, seed=2)[0]
        sched.add_request(warm)
        for step in range(20):
            if not sched.has_work():
                break
            _step(sched, runner, step * MS)
        reqs = make_requests(3, prompt_len=6, max_tokens=6, prefix=prefix, seed=3)
        for r in reqs:
            sched.add_request(r)
        sizes = []
        outputs = {}
        for step in range(20, 200):
            if not sched.has_work():
                break
            plan, events = _step(sched, runner, step * MS, StepCosts(1, 1))
            if plan.prefills:
                assert all(c.start > 0 for c in plan.prefills)  # every one on a cached or resident prefix
                sizes.append(len(plan.prefills))
            for request, ev in events:
                outputs.setdefault(request.request_id, []).append(ev.token_id)
        assert sizes == expected, capable
        for r in reqs:
            assert outputs[r.request_id] == reference_generate(r.prompt_ids, 6)


def test_mixed_steps_carry_the_decodes_when_the_runner_can():
    """A runner that runs decode rows inside a prefill call (OpenVINO, torch): every TTFT-first prefill run also
    decodes the running sequences; the outputs are unchanged, and no step is a prefill without the decodes."""
    for capable in (False, True):
        sched = _sched(max_prefill_tokens=8)
        sched.mix_decodes = capable
        runner = _runner(sched)
        reqs = make_requests(4, prompt_len=6, max_tokens=8, seed=5)
        outputs: dict[str, list[int]] = {}
        mixed = 0
        for i, r in enumerate(reqs):
            sched.add_request(r)
            for step in range(i * 3, i * 3 + 3):  # arrivals spread out: prompts come while others decode
                plan, events = _step(sched, runner, step * MS, StepCosts(1, 1))
                mixed += bool(plan.prefills and plan.decodes)
                for request, ev in events:
                    outputs.setdefault(request.request_id, []).append(ev.token_id)
        for step in range(100, 300):
            if not sched.has_work():
                break
            plan, events = _step(sched, runner, step * MS, StepCosts(1, 1))
            for request, ev in events:
                outputs.setdefault(request.request_id, []).append(ev.token_id)
        assert (mixed > 0) == capable
        for r in reqs:
            assert outputs[r.request_id] == reference_generate(r.prompt_ids, 8), capable
