"""LLMEngine with the fake runner: thread-safe submission, sync and async streams, cancel, metrics, errors."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

from llmkiln.runtime.engine import EngineFailed, LLMEngine
from llmkiln.runtime.handle import RequestFailed
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.request import QueueFull, SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig

from .conftest import VOCAB, FakeRunner, reference_generate


def make_engine(**overrides) -> LLMEngine:
    base = dict(
        max_batch_size=4, max_num_tokens=32, max_prefill_tokens=8, tokens_per_block=4, max_input_len=100
    )
    base.update(overrides)
    config = SchedulerConfig.make(**base)
    return LLMEngine(
        config, FakeRunner(config.scheduler.max_batch_size, 32, config.kv_cache.tokens_per_block)
    )


def _prompt(i: int, n: int = 11) -> list[int]:
    return [3 + (i * 7 + j * 3) % (VOCAB - 3) for j in range(n)]


def test_threads_submit_concurrently_and_get_their_own_tokens():
    eng = make_engine(max_queue_size=200).start()
    results: dict[int, list[int]] = {}
    errors = []

    def client(i: int) -> None:
        try:
            prompt = [5, 6, 7, 8, 9, 10, 11, 12] + _prompt(i)  # shared 2-block prefix
            h = eng.submit(prompt, SamplingParams(max_tokens=6))
            results[i] = (prompt, [ev.token_id for ev in h])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    for prompt, tokens in results.values():
        assert tokens == reference_generate(prompt, 6)
    m = eng.metrics()
    assert m["requests_finished"] == 24 and m["generated_tokens"] == 24 * 6
    assert m["prefix_cache_hits"] >= 1 and m["prefix_cache_hit_tokens"] >= 8
    assert m["num_running"] == 0 and m["kv_blocks_pinned"] == 0
    eng.shutdown()


def test_async_stream_and_timings():
    eng = make_engine().start()

    async def main():
        h = eng.submit(_prompt(1), SamplingParams(max_tokens=5), request_id="x")
        events = [ev async for ev in h.aiter()]
        again = [ev async for ev in h.aiter()]  # a late consumer replays the stream
        return h, events, again

    h, events, again = asyncio.run(main())
    assert [e.token_id for e in events] == reference_generate(_prompt(1), 5)
    assert [e.index for e in events] == list(range(5))
    assert events[-1].finished and events[-1].finish_reason == "length" and again == events
    t = h.timings
    assert t.arrival_ns <= t.first_scheduled_ns <= t.first_token_ns <= t.finish_ns
    assert t.ttft_ns == t.first_token_ns - t.arrival_ns
    assert h.result() == [e.token_id for e in events]
    eng.shutdown()


def test_cancel_waiting_and_running():
    eng = make_engine(max_batch_size=1)
    running = eng.submit(_prompt(2), SamplingParams(max_tokens=50))
    waiting = eng.submit(_prompt(3), SamplingParams(max_tokens=50))
    eng.step()
    eng.step()
    assert eng.metrics()["num_running"] == 1 and eng.metrics()["queue_length"] == 1
    waiting.cancel()
    running.cancel()
    eng.step()
    assert running.finish_reason == "cancelled" and waiting.finish_reason == "cancelled"
    assert len(running.result()) >= 1 and waiting.result() == []
    m = eng.metrics()
    assert m["num_free_slots"] == 1 and m["queue_length"] == 0 and m["requests_cancelled"] == 2
    eng.shutdown()


def test_queue_bound_counts_only_waiting_requests():
    eng = make_engine(max_batch_size=1, max_queue_size=2)
    a = eng.submit(_prompt(4), SamplingParams(max_tokens=3))
    b = eng.submit(_prompt(5), SamplingParams(max_tokens=3))
    with pytest.raises(QueueFull):
        eng.submit(_prompt(6), SamplingParams(max_tokens=3))
    eng.step()  # a is admitted: one place frees up
    eng.submit(_prompt(6), SamplingParams(max_tokens=3))
    with pytest.raises(QueueFull):  # an id in use is made unique, not rejected; the queue is full again
        eng.submit(_prompt(7), request_id=a.request_id)
    while eng.metrics()["queue_length"] == 2:
        eng.step()
    dup = eng.submit(_prompt(7), SamplingParams(max_tokens=3), request_id=b.request_id)
    assert dup.request_id != b.request_id and dup.request_id.startswith(b.request_id)
    eng.start()
    assert a.result(timeout=10)
    eng.shutdown()


def test_runner_failure_fails_running_requests_and_engine_keeps_serving():
    eng = make_engine()
    real = eng.runner.execute
    calls = {"n": 0}

    def flaky(plan, trace=None):
        if plan.prefills or plan.decodes:  # not the store copies run after a step's events
            calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(plan, trace)

    eng.runner.execute = flaky
    h = eng.submit(_prompt(8), SamplingParams(max_tokens=5))
    eng.start()
    assert h.wait(10) and h.finish_reason == "error"
    with pytest.raises(RequestFailed, match="boom"):
        h.result()
    assert len(eng.submit(_prompt(9), SamplingParams(max_tokens=3)).result(timeout=10)) == 3
    assert eng.metrics()["requests_failed"] == 1 and eng.metrics()["kv_blocks_pinned"] == 0
    eng.shutdown()


def test_sampling_is_seeded():
    eng = make_engine().start()
    real = eng.runner.execute
    eng.runner.execute = lambda plan, trace=None: {
        k: np.zeros(VOCAB, np.float32) for k in real(plan)
    }  # uniform
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=123)
    a = eng.submit(_prompt(10), p).result(timeout=10)
    b = eng.submit(_prompt(11), p).result(timeout=10)
    c = eng.submit(_prompt(12), SamplingParams(max_tokens=8, temperature=1.0, seed=7)).result(timeout=10)
    assert a == b and a != c
    eng.shutdown()


STEP_TIMES = ("sched_us", "load_us", "save_us", "sample_us", "update_us", "emit_us", "total_us")
STEP_COUNTS = ("t", "loads", "saves", "waiting", "running")


def test_step_profile_records_every_step_and_request(tmp_path):
    """Structure only: a record per step run and per request, every field there and non-negative (how long a
    phase took depends on the machine's load: timing belongs in the benchmarks)."""
    eng = make_engine(max_batch_size=2, max_prefill_tokens=32)
    prof = eng.enable_profile(tmp_path / "profile.jsonl")
    shared = [5, 6, 7, 8, 9, 10, 11, 12]  # two blocks of 4: the second request loads them into its slot
    first = eng.submit(shared + _prompt(1), SamplingParams(max_tokens=4), request_id="a")
    ran = int(eng.step())  # a's prefill: its blocks are in the store now, and a keeps slot 0
    second = eng.submit(shared + _prompt(2), SamplingParams(max_tokens=4), request_id="b")
    while not (first.finished and second.finished):
        ran += eng.step()
    eng.shutdown()
    assert prof.path.is_file()
    records = [json.loads(line) for line in prof.path.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    requests = {r["id"]: r for r in records if r["kind"] == "request"}
    assert len(steps) == ran  # every step that ran, once
    assert set(requests) == {"a", "b"} and requests["b"]["cached"] == 8 and requests["a"]["cached"] == 0
    assert [s["loads"] for s in steps if s["loads"]] == [2]  # b's two cached blocks, in one step
    prefill_runs = [run for s in steps for run in s["prefill"]]
    assert [run[4] for run in prefill_runs] == [["a"], ["b"]]
    assert prefill_runs[1][1:3] == [11, 8]  # b computes its 11 own tokens on an 8-token past
    assert sum(s["decode"][0] for s in steps if s["decode"]) == 6  # 3 decoded tokens each
    for s in steps:
        for key in (*STEP_TIMES, *STEP_COUNTS):
            assert isinstance(s[key], int) and s[key] >= 0, (key, s)
        for batch, tokens, past, us, ids in s["prefill"]:
            assert batch == len(ids) >= 1 and tokens >= 1 and past >= 0 and us >= 0
        if s["decode"] is not None:
            assert len(s["decode"]) == 4 and all(isinstance(v, int) and v >= 0 for v in s["decode"])
    for rid, r in requests.items():
        assert r["reason"] == "length" and r["prompt"] == len(shared) + len(_prompt(1 if rid == "a" else 2))
        for key in ("arrival", "scheduled", "first_token", "finish"):
            assert isinstance(r[key], int) and r[key] > 0, (rid, key)


def test_an_idle_engine_has_written_its_profile_records(tmp_path):
    """The engine thread writes the buffered records when it goes idle, not only at shutdown: a served engine
    whose process is stopped without a clean shutdown (kiln profile on a loaded CI machine) lost its last
    request's records, and the level's profile missed that request."""
    eng = make_engine(max_batch_size=2).start()
    prof = eng.enable_profile(tmp_path / "profile.jsonl")
    try:
        handle = eng.submit(_prompt(3), SamplingParams(max_tokens=4), request_id="last")
        assert handle.wait(10)
        deadline = time.monotonic() + 10
        while True:
            text = prof.path.read_text()
            if '"id":"last"' in text:
                break
            assert time.monotonic() < deadline, "the finished request's record is still buffered"
            time.sleep(0.01)
        records = [json.loads(line) for line in text.splitlines()]
        assert sum(1 for r in records if r["kind"] == "step") >= 4  # its steps are written with it
    finally:
        eng.shutdown()


def test_scheduler_thread_exception_fails_requests_and_marks_unhealthy():
    """A bug in the scheduler thread (not the runner) must fail every caller, never leave one hanging."""
    eng = make_engine(max_batch_size=1)
    real = eng.scheduler.schedule
    calls = {"n": 0}

    def broken(now_ns=0, costs=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("scheduler bug")
        return real(now_ns, costs)

    eng.scheduler.schedule = broken
    running = eng.submit(_prompt(20), SamplingParams(max_tokens=50))
    waiting = eng.submit(_prompt(21), SamplingParams(max_tokens=50))
    assert eng.healthy and eng.num_in_flight == 2
    eng.start()
    for h in (running, waiting):
        assert h.wait(10) and h.finish_reason == "error"
        with pytest.raises(RequestFailed, match="scheduler bug"):
            h.result()
    assert not eng.healthy and "scheduler bug" in eng.failure
    assert eng.num_in_flight == 0 and eng.metrics()["requests_failed"] == 2
    with pytest.raises(EngineFailed, match="scheduler bug"):
        eng.submit(_prompt(22))
    eng.shutdown(timeout_s=1)


def test_num_in_flight_counts_queued_and_running():
    eng = make_engine(max_batch_size=1)
    assert eng.num_in_flight == 0
    a = eng.submit(_prompt(30), SamplingParams(max_tokens=3))
    eng.submit(_prompt(31), SamplingParams(max_tokens=3))
    assert eng.num_in_flight == 2
    eng.start()
    a.result(timeout=10)
    eng.shutdown()
    assert eng.num_in_flight == 0


def test_call_runs_on_the_scheduler_thread_and_import_feeds_admission():
    """LLMEngine.call runs between steps on the scheduler thread; a reservation passed to submit is published
    right before the request is queued, so it is admitted with the imported prefix as cached tokens."""
    eng = make_engine().start()
    try:
        assert eng.call(lambda: threading.current_thread().name).result(5) == "llmkiln-scheduler"
        with pytest.raises(ZeroDivisionError):
            eng.call(lambda: 1 / 0).result(5)
        prompt = _prompt(1, 13)
        expected = reference_generate(prompt, 5)
        assert eng.submit(prompt, SamplingParams(max_tokens=5)).result() == expected
        store = eng.block_store
        assert store is not None
        exporting = eng.submit(prompt, SamplingParams(max_tokens=1), handoff=KvHandoff(export_prefix=True))
        assert exporting.exported is not None
        store_ids = exporting.exported.result(5)
        assert len(store_ids) == 3 and store.num_pinned == 3
        eng.kv.release_blocks(store_ids).result(5)
        assert store.num_pinned == 0
        res = eng.kv.reserve_import(prompt, 3).result(5)
        assert res.fill == ()  # all stored here already
        h = eng.submit(prompt, SamplingParams(max_tokens=5), handoff=KvHandoff(kv_import=res))
        assert h.result() == expected and h.num_cached_tokens == 12
        assert store.num_pinned == 0
    finally:
        eng.shutdown()
    with pytest.raises(Exception, match="not running"):
        eng.call(lambda: None).result(5)


def test_compute_priority_idle_moves_the_scheduler_thread_to_sched_idle():
    """`kiln serve --decode-first` gives the prefill tier's compute idle priority: the scheduler thread (where
    onnxruntime computes with one intra-op thread) runs SCHED_IDLE; the calling thread keeps its policy."""
    import os

    eng = make_engine()
    eng.compute_priority = "idle"
    eng.start()
    try:
        policy = eng.call(lambda: os.sched_getscheduler(0)).result(10)
        assert policy == os.SCHED_IDLE
        assert os.sched_getscheduler(0) != os.SCHED_IDLE
        out = eng.generate([_prompt(1)], SamplingParams(max_tokens=3))  # it still serves
        assert len(out[0]) == 3
    finally:
        eng.shutdown()
    normal = make_engine()
    normal.start()
    try:
        assert normal.call(lambda: os.sched_getscheduler(0)).result(10) == os.SCHED_OTHER
    finally:
        normal.shutdown()
