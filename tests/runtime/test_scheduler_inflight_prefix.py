"""A burst on a prefix nobody has cached yet: the scheduler computes it once. Waiting prompts whose next uncached
blocks a running prompt is computing wait for them (runtime/scheduler.py, INFLIGHT_PREFIX_MIN_TOKENS) and start
on them as cache hits; prompts that share nothing go ahead meanwhile. On the slot runner and the paged one, in
the decode-first (budget) and TTFT-first modes; outputs stay the reference model's."""

from __future__ import annotations

import pytest

from llmkiln.runtime import scheduler as scheduler_mod
from llmkiln.runtime.scheduler import Scheduler

from .conftest import (
    FakeRunner,
    PagedFakeRunner,
    apply_plan,
    make_paged_scheduler,
    make_requests,
    make_scheduler,
    reference_generate,
)

BS = 4
PREFIX = [5 + i % 90 for i in range(96)]  # 24 blocks: 3 prefill chunks of 32


def _runner(sched: Scheduler) -> FakeRunner | PagedFakeRunner:
    if sched.pool is not None:
        return PagedFakeRunner(sched.config.scheduler.max_batch_size, sched.pool.num_blocks, BS)
    return FakeRunner(sched.config.scheduler.max_batch_size, 64, BS)


def _burst(sched: Scheduler):
    """Three prompts on PREFIX and one of its own, all waiting at once."""
    shared = make_requests(3, prompt_len=6, max_tokens=4, prefix=PREFIX, seed=1)
    alone = make_requests(1, prompt_len=20, max_tokens=4, seed=2)[0]
    for r in [*shared, alone]:
        sched.add_request(r)
    return shared, alone


def _drive(sched: Scheduler):
    runner = _runner(sched)
    outputs: dict[str, list[int]] = {}
    computed: dict[str, int] = {}  # prompt tokens each request prefilled itself
    admitted_at: dict[str, int] = {}
    for step in range(200):
        if not sched.has_work():
            break
        plan = sched.schedule(now_ns=step)
        for rid in plan.admitted:
            admitted_at[rid] = step
        for chunk in plan.prefills:
            computed[chunk.request_id] = computed.get(chunk.request_id, 0) + len(chunk.token_ids)
        for request, ev in apply_plan(sched, runner, plan, now_ns=step):
            outputs.setdefault(request.request_id, []).append(ev.token_id)
    assert not sched.has_work()
    return outputs, computed, admitted_at


MODES = {
    "budget": {},
    "ttft-first": {"ttft_first": True, "tpot_slo_ms": 1000.0},
}


@pytest.mark.parametrize("paged", [False, True], ids=["slots", "paged"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_burst_on_an_uncached_prefix_computes_it_once(paged, mode):
    make = make_paged_scheduler if paged else make_scheduler
    sched = make(num_blocks=200, max_batch_size=4, max_num_tokens=64, max_prefill_tokens=32, **MODES[mode])
    shared, alone = _burst(sched)
    outputs, computed, admitted_at = _drive(sched)
    for r in [*shared, alone]:
        assert outputs[r.request_id] == reference_generate(r.prompt_ids, 4), r.request_id
    first, *later = shared
    assert computed[first.request_id] == len(first.prompt_ids)  # the prefix, once
    for r in later:  # the rest start on it: at most its last partial block and their own tokens
        assert computed[r.request_id] <= len(r.prompt_ids) - len(PREFIX) + BS, (r.request_id, computed)
        assert admitted_at[r.request_id] > admitted_at[first.request_id]
        assert r.num_cached_tokens >= len(PREFIX) - BS
    # the prompt that shares nothing did not wait for the prefix
    assert admitted_at[alone.request_id] < max(admitted_at[r.request_id] for r in later)
    assert sched.num_inflight_prefix_waits == 2


def test_off_by_the_environment_every_prompt_computes_the_prefix(monkeypatch):
    monkeypatch.setenv(scheduler_mod.INFLIGHT_PREFIX_ENV, "0")
    sched = make_paged_scheduler(num_blocks=200, max_batch_size=4, max_num_tokens=256, max_prefill_tokens=128)
    shared, _ = _burst(sched)
    outputs, computed, _ = _drive(sched)
    assert all(computed[r.request_id] == len(r.prompt_ids) for r in shared)
    assert sched.num_inflight_prefix_waits == 0
    for r in shared:
        assert outputs[r.request_id] == reference_generate(r.prompt_ids, 4)


def test_a_short_shared_run_is_not_worth_waiting_for():
    """Less than INFLIGHT_PREFIX_MIN_TOKENS in common: computed again rather than waited for."""
    sched = make_paged_scheduler(num_blocks=200, max_batch_size=4, max_num_tokens=64, max_prefill_tokens=32)
    sched.long_prompts_fcfs = (
        False  # both long prompts in the first step (first come, first served would hold one)
    )
    short = PREFIX[: scheduler_mod.INFLIGHT_PREFIX_MIN_TOKENS - BS]
    reqs = make_requests(2, prompt_len=40, max_tokens=2, prefix=short, seed=3)
    for r in reqs:
        sched.add_request(r)
    plan = sched.schedule(now_ns=0)
    assert set(plan.admitted) == {r.request_id for r in reqs}
    assert sched.num_inflight_prefix_waits == 0


def test_a_cancelled_prompt_releases_the_ones_waiting_for_its_blocks():
    sched = make_paged_scheduler(num_blocks=200, max_batch_size=4, max_num_tokens=64, max_prefill_tokens=32)
    shared, alone = _burst(sched)
    runner = _runner(sched)
    plan = sched.schedule(now_ns=0)
    assert shared[0].request_id in plan.admitted and shared[1].request_id not in plan.admitted
    apply_plan(sched, runner, plan, now_ns=0)
    sched.abort(shared[0].request_id, now_ns=1)
    plan = sched.schedule(now_ns=2)
    assert shared[1].request_id in plan.admitted  # nobody computes the prefix now: it does
    apply_plan(sched, runner, plan, now_ns=2)
    for step in range(3, 200):
        if not sched.has_work():
            break
        apply_plan(sched, runner, sched.schedule(now_ns=step), now_ns=step)
    assert not sched.has_work() and sched.pool is not None
    sched.pool.check_invariants()
    assert sched.pool.num_pinned == 0 and sched.pool.num_reserved == 0
