"""Scheduler tests with the fake runner: no model, no arrays beyond one-hot logits."""

from __future__ import annotations

from llmkiln.runtime.request import FinishReason, RequestStatus

from .conftest import (
    FakeRunner,
    apply_plan,
    make_requests,
    make_scheduler,
    reference_generate,
    run_to_completion,
)


def _runner(sched) -> FakeRunner:
    return FakeRunner(
        sched.config.scheduler.max_batch_size, sched.block_store.num_blocks if sched.block_store else 0, 4
    )


def _assert_all_free(sched) -> None:
    assert sched.num_running == 0
    assert sched.num_free_slots == sched.config.scheduler.max_batch_size
    assert not sched.requests
    if sched.block_store is not None:
        assert sched.block_store.num_pinned == 0
        assert sched.block_store.num_free == sched.block_store.num_blocks
        sched.block_store.check_invariants()


def test_outputs_match_reference_with_every_switch():
    for chunked in (True, False):
        for reuse in (True, False):
            for batching in ("inflight", "static"):
                sched = make_scheduler(
                    chunked_prefill=chunked, prefix_reuse=reuse, batching=batching, static_batch_timeout_ms=0
                )
                reqs = make_requests(7, prompt_len=23, max_tokens=6, prefix=list(range(3, 15)), seed=1)
                for r in reqs:
                    sched.add_request(r)
                runner = _runner(sched)
                outputs = run_to_completion(sched, runner)
                for r in reqs:
                    assert outputs[r.request_id] == reference_generate(r.prompt_ids, 6), (
                        chunked,
                        reuse,
                        batching,
                    )
                    assert r.finish_reason is FinishReason.LENGTH
                _assert_all_free(sched)


def test_chunks_respect_budget_and_chunk_size():
    sched = make_scheduler(max_num_tokens=20, max_prefill_tokens=8, max_batch_size=3)
    reqs = make_requests(3, prompt_len=30, max_tokens=3)
    for r in reqs:
        sched.add_request(r)
    runner = _runner(sched)
    run_to_completion(sched, runner)
    for plan in runner.steps:
        assert plan.num_tokens <= 20
        assert all(len(c.token_ids) <= 8 for c in plan.prefills)
    # the first step already admitted more than one request (chunks interleave)
    assert len(runner.steps[0].admitted) >= 2


def test_unchunked_prompt_runs_whole():
    sched = make_scheduler(chunked_prefill=False, max_num_tokens=16, max_prefill_tokens=8)
    (r,) = make_requests(1, prompt_len=40, max_tokens=2)
    sched.add_request(r)
    plan = sched.schedule()
    assert len(plan.prefills) == 1 and len(plan.prefills[0].token_ids) == 40 and plan.prefills[0].sample


def test_decode_interleaves_with_prefill_chunks():
    sched = make_scheduler(max_num_tokens=12, max_prefill_tokens=8)
    a, b = make_requests(2, prompt_len=5, max_tokens=20)
    sched.add_request(a)
    runner = _runner(sched)
    plan = sched.schedule()
    apply_plan(sched, runner, plan)
    b.prompt_ids = b.prompt_ids + list(range(3, 40))  # a long prompt arrives while a decodes
    sched.add_request(b)
    plan = sched.schedule()
    assert [d.request_id for d in plan.decodes] == [a.request_id]
    assert plan.prefills and plan.prefills[0].request_id == b.request_id and not plan.prefills[0].sample


def test_prefix_hit_loads_blocks_and_prefills_rest():
    sched = make_scheduler(tokens_per_block=4)
    prefix = list(range(10, 22))  # 3 full blocks of 4
    (a,) = make_requests(1, prompt_len=5, prefix=prefix, max_tokens=2, seed=3)
    (b,) = make_requests(1, prompt_len=7, prefix=prefix, max_tokens=2, seed=4)
    (other,) = make_requests(1, prompt_len=9, max_tokens=1, seed=5)
    runner = _runner(sched)
    sched.add_request(a)
    run_to_completion(sched, runner)
    sched.add_request(other)  # takes a's slot (the lowest of equals): the prefix is then only in the store
    run_to_completion(sched, runner)
    sched.add_request(b)
    plan = sched.schedule()
    assert [ld.start for ld in plan.loads] == [0, 4, 8]
    assert b.num_cached_tokens == 12
    assert plan.prefills[0].start == 12 and len(plan.prefills[0].token_ids) == 7
    apply_plan(sched, runner, plan)
    assert sched.block_store.num_pinned == 3
    outputs = run_to_completion(sched, runner)
    assert b.output_ids == reference_generate(b.prompt_ids, 2)
    assert outputs[b.request_id] == b.output_ids[1:]
    _assert_all_free(sched)


def test_next_prompt_starts_on_the_prefix_its_slot_still_holds():
    sched = make_scheduler(tokens_per_block=4, max_batch_size=2)
    prefix = list(range(10, 24))  # 3 full blocks of 4 + 2 tokens
    (a,) = make_requests(1, prompt_len=5, prefix=prefix, max_tokens=3, seed=3)
    (b,) = make_requests(1, prompt_len=7, prefix=prefix, max_tokens=3, seed=4)
    (c,) = make_requests(1, prompt_len=6, prefix=prefix, max_tokens=3, seed=6)
    runner = _runner(sched)
    sched.add_request(a)
    run_to_completion(sched, runner)
    sched.add_request(b)
    plan = sched.schedule()
    assert plan.admitted == [b.request_id] and b.slot == 0  # a is done; slot 0 still holds its prompt
    assert not plan.loads and b.num_cached_tokens == b.num_computed_tokens >= 14  # the whole shared prefix
    assert plan.prefills[0].start == b.num_cached_tokens
    # the store's copies of that prefix are pinned while b runs on it (no copy made, but in use: never evicted
    # under it, and refreshed in the LRU afterwards, so the KV router keeps seeing them on this worker)
    prefix_blocks = sched.block_store.lookup(prefix, 12, record=False)
    assert len(prefix_blocks) == 3 and all(sched.block_store.blocks[i].ref_count > 0 for i in prefix_blocks)
    apply_plan(sched, runner, plan)
    sched.add_request(c)  # slot 0 is busy with b: c loads the cached blocks into slot 1
    plan = sched.schedule()
    assert c.slot == 1 and [ld.start for ld in plan.loads] == [0, 4, 8] and c.num_cached_tokens == 12
    apply_plan(sched, runner, plan)
    run_to_completion(sched, runner)
    for r in (b, c):
        assert r.output_ids == reference_generate(r.prompt_ids, 3)
    _assert_all_free(sched)


def test_lookup_never_covers_whole_prompt():
    sched = make_scheduler(tokens_per_block=4)
    (a,) = make_requests(1, prompt_len=8, max_tokens=1)
    runner = _runner(sched)
    sched.add_request(a)
    run_to_completion(sched, runner)
    (b,) = make_requests(1, prompt_len=0, max_tokens=1, prefix=list(a.prompt_ids))
    sched.add_request(b)
    run_to_completion(sched, runner)
    # the slot still holds a's 8 prompt tokens (the store has one 4-token block): one token is computed anyway
    assert b.num_cached_tokens == 7
    assert b.output_ids == reference_generate(b.prompt_ids, 1)


def test_priority_policy_orders_admission():
    sched = make_scheduler(policy="priority", max_batch_size=1)
    reqs = make_requests(4, prompt_len=6, max_tokens=1, priorities=[0, 5, 1, 5])
    for r in reqs:
        sched.add_request(r)
    runner = _runner(sched)
    run_to_completion(sched, runner)
    order = [rid for plan in runner.steps for rid in plan.admitted]
    assert order == [reqs[1].request_id, reqs[3].request_id, reqs[2].request_id, reqs[0].request_id]


def test_fcfs_ignores_priority():
    sched = make_scheduler(policy="fcfs", max_batch_size=1)
    reqs = make_requests(3, prompt_len=6, max_tokens=1, priorities=[0, 9, 5])
    for r in reqs:
        sched.add_request(r)
    runner = _runner(sched)
    run_to_completion(sched, runner)
    assert [rid for p in runner.steps for rid in p.admitted] == [r.request_id for r in reqs]


def test_cancel_frees_slot_and_blocks():
    sched = make_scheduler(max_batch_size=2)
    prefix = list(range(10, 22))
    a, b, c = make_requests(3, prompt_len=6, prefix=prefix, max_tokens=50)
    runner = _runner(sched)
    sched.add_request(a)
    run_to_completion_steps(sched, runner, 2)
    sched.add_request(b)
    sched.add_request(c)
    run_to_completion_steps(sched, runner, 2)
    assert b.status is RequestStatus.RUNNING and b.pinned_block_ids
    assert c.status is RequestStatus.WAITING
    assert sched.abort(b.request_id) is b and sched.abort(c.request_id) is c
    assert sched.abort(c.request_id) is None
    assert b.finish_reason is FinishReason.CANCELLED and c.finish_reason is FinishReason.CANCELLED
    assert sched.abort(a.request_id) is a
    _assert_all_free(sched)


def run_to_completion_steps(sched, runner, n):
    for _ in range(n):
        plan = sched.schedule()
        apply_plan(sched, runner, plan)


def test_eos_and_stop_tokens_finish():
    sched = make_scheduler(eos_token_ids=tuple(range(0, 97)))  # every token is EOS
    (a,) = make_requests(1, max_tokens=5)
    sched.add_request(a)
    run_to_completion(sched, _runner(sched))
    assert len(a.output_ids) == 1 and a.finish_reason is FinishReason.STOP


def test_static_batching_waits_for_batch_or_timeout():
    sched = make_scheduler(batching="static", max_batch_size=3, static_batch_timeout_ms=1)
    a, b, c, d = make_requests(4, max_tokens=2)
    sched.add_request(a)
    a.timings.arrival_ns = 0
    assert sched.schedule(now_ns=10).is_empty  # not full, timeout not reached
    assert sched.schedule(now_ns=2_000_000).admitted == [a.request_id]
    sched2 = make_scheduler(batching="static", max_batch_size=2, static_batch_timeout_ms=10_000)
    for r in (b, c, d):
        sched2.add_request(r)
    runner = _runner(sched2)
    plan = sched2.schedule(now_ns=0)
    assert plan.admitted == [b.request_id, c.request_id]
    apply_plan(sched2, runner, plan)
    plan = sched2.schedule(now_ns=0)
    assert not plan.admitted  # batch runs to completion first
    apply_plan(sched2, runner, plan)
    plan = sched2.schedule(now_ns=0)
    assert not plan.admitted and plan.is_empty  # d alone, waits for timeout
    assert sched2.next_wakeup_ns() is not None


def test_block_store_full_skips_saves_but_stays_correct():
    sched = make_scheduler(num_blocks=2, tokens_per_block=4)
    reqs = make_requests(5, prompt_len=17, max_tokens=3, prefix=list(range(20, 32)))
    for r in reqs:
        sched.add_request(r)
    runner = _runner(sched)
    outputs = run_to_completion(sched, runner)
    for r in reqs:
        assert outputs[r.request_id] == reference_generate(r.prompt_ids, 3)
    _assert_all_free(sched)


def _chunks(plan) -> dict[str, int]:
    return {c.request_id: len(c.token_ids) for c in plan.prefills}


def _record(done: dict[str, list[int | None]], events) -> None:
    for request, ev in events:
        done.setdefault(request.request_id, []).append(ev.token_id)


def _start_decoding(sched, runner, done: dict[str, list[int | None]], max_tokens: int, seed: int):
    """One request, its prompt run alone: it decodes from the next step on."""
    request = make_requests(1, prompt_len=10, max_tokens=max_tokens, seed=seed)[0]
    sched.add_request(request)
    _record(done, apply_plan(sched, runner, sched.schedule(now_ns=0)))
    return request


def test_long_prompts_go_first_come_first_served_in_the_tokens_they_bring():
    """Each long prompt (more left than the cap) brings a cap of tokens to the step; the oldest takes them all
    while it needs them; a long one left with nothing waits (not admitted) and shorter ones behind it go ahead.
    Outputs stay the reference model's."""
    sched = make_scheduler(
        num_blocks=256,
        max_batch_size=5,
        max_num_tokens=160,
        max_prefill_tokens=128,
        max_prefill_tokens_decoding=32,
    )
    runner = _runner(sched)
    done: dict[str, list[int | None]] = {}
    first = _start_decoding(sched, runner, done, max_tokens=8, seed=10)
    longs = make_requests(3, prompt_len=100, max_tokens=3, seed=11)
    short = make_requests(1, prompt_len=20, max_tokens=3, seed=12)[0]
    for r in [*longs, short]:
        sched.add_request(r)
    plan = sched.schedule(now_ns=1)
    # three long prompts bring 3 x 32: the oldest takes all 96; the other two wait; the short one takes its 20
    assert _chunks(plan) == {longs[0].request_id: 96, short.request_id: 20} and len(plan.decodes) == 1
    assert set(plan.admitted) == {longs[0].request_id, short.request_id}
    assert [r.request_id for r in sched.waiting] == [longs[1].request_id, longs[2].request_id]
    _record(done, apply_plan(sched, runner, plan))
    plan = sched.schedule(now_ns=2)
    # the first long prompt's last 4 tokens (no longer long), then the next one takes the two caps left
    assert _chunks(plan) == {longs[0].request_id: 4, longs[1].request_id: 64}
    _record(done, apply_plan(sched, runner, plan))
    for rid, ids in run_to_completion(sched, runner).items():
        done.setdefault(rid, []).extend(ids)
    for r in [*longs, short]:
        assert done[r.request_id] == reference_generate(r.prompt_ids, 3)
    assert done[first.request_id] == reference_generate(first.prompt_ids, 8)
    _assert_all_free(sched)


def test_a_lone_long_prompt_among_decodes_still_takes_one_cap():
    """With sequences decoding, one long prompt brings one cap (max_prefill_tokens_decoding): their stall stays
    bounded as before."""
    sched = make_scheduler(
        num_blocks=256,
        max_batch_size=4,
        max_num_tokens=128,
        max_prefill_tokens=64,
        max_prefill_tokens_decoding=16,
    )
    _start_decoding(sched, _runner(sched), {}, max_tokens=20, seed=13)
    long = make_requests(1, prompt_len=100, max_tokens=2, seed=14)[0]
    sched.add_request(long)
    plan = sched.schedule(now_ns=1)
    assert _chunks(plan) == {long.request_id: 16} and len(plan.decodes) == 1


def test_without_first_come_first_served_long_prompts_share_the_step_a_cap_each():
    sched = make_scheduler(num_blocks=256, max_batch_size=4, max_num_tokens=128, max_prefill_tokens=32)
    sched.long_prompts_fcfs = False  # $LLMKILN_LONG_PROMPTS_FCFS=0
    longs = make_requests(3, prompt_len=100, max_tokens=3, seed=15)
    for r in longs:
        sched.add_request(r)
    assert _chunks(sched.schedule(now_ns=0)) == {r.request_id: 32 for r in longs}


def test_the_decoding_cap_can_wait_for_short_prompts():
    """decoding_cap_needs_short_prompts: after SHORT_PROMPT_WINDOW long prompts in a row a prompt takes
    max_prefill_tokens a step while sequences decode; one short prompt admitted brings the cap back. Without the
    setting the cap always applies."""
    from llmkiln.runtime.scheduler import SHORT_PROMPT_WINDOW

    for on in (True, False):
        sched = make_scheduler(
            num_blocks=4096,
            max_batch_size=SHORT_PROMPT_WINDOW + 4,
            max_num_tokens=256,
            max_prefill_tokens=128,
            max_prefill_tokens_decoding=16,
            decoding_cap_needs_short_prompts=on,
        )
        runner = _runner(sched)
        # long prompts (40 tokens > the cap of 16), one after the other, each to its first token; they go on decoding
        for r in make_requests(SHORT_PROMPT_WINDOW, prompt_len=40, max_tokens=150, seed=20):
            sched.add_request(r)
            while r.num_computed_tokens < len(r.prompt_ids):
                apply_plan(sched, runner, sched.schedule(now_ns=0))
        probe = make_requests(1, prompt_len=100, max_tokens=2, seed=21)[0]
        sched.add_request(probe)
        plan = sched.schedule(now_ns=1)
        assert len(plan.decodes) == SHORT_PROMPT_WINDOW
        assert _chunks(plan) == {probe.request_id: 100 if on else 16}
        apply_plan(sched, runner, plan)
        if not on:
            continue
        short = make_requests(1, prompt_len=10, max_tokens=150, seed=22)[0]
        sched.add_request(short)
        apply_plan(
            sched, runner, sched.schedule(now_ns=2)
        )  # admitted whole: a short prompt among the last 16
        probe2 = make_requests(1, prompt_len=100, max_tokens=2, seed=23)[0]
        sched.add_request(probe2)
        assert _chunks(sched.schedule(now_ns=3))[probe2.request_id] == 16
