"""experiments.cpu_peer_llmkiln_inprocess: the closed loop that drives the runtime in-process (on the front doors'
fake engine here; the measured runs drive LLMEngine)."""

from __future__ import annotations

import asyncio

import pytest

from experiments.cpu_peer_llmkiln_inprocess import closed_loop, stepped_loop
from llmkiln.bench.workloads import BenchRequest, Workload
from tests.serve.fake_engine import FakeEngine


def test_the_closed_loop_keeps_c_in_flight_and_records_every_token():
    engine = FakeEngine()
    reqs = [BenchRequest(i, "x", 3 + i % 4, 10, "shared") for i in range(12)]
    wl = Workload("shared-prefix", 0, {}, reqs)
    peak = 0

    async def run():
        nonlocal peak

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, engine.active)
                await asyncio.sleep(0.001)

        w = asyncio.create_task(watch())
        out = await closed_loop(engine, wl, {r.index: [7] * 10 for r in reqs}, concurrency=3)  # type: ignore[arg-type]
        w.cancel()
        return out

    records = asyncio.run(run())
    assert [r.index for r in records] == list(range(12)) and all(r.ok for r in records)
    assert [r.num_output_tokens for r in records] == [r.max_tokens for r in reqs]
    assert all(len(r.token_ns) == r.num_output_tokens and r.end_ns >= r.token_ns[-1] for r in records)
    assert peak == 3


@pytest.mark.slow
def test_the_stepped_loop_steps_the_engine_itself_and_refills_before_the_next_step(engine_factory):
    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.loader import load_engine

    eng = load_engine(EngineDir(engine_factory("stories-ov-fp32")))
    reqs = [BenchRequest(i, "x", 3 + i % 4, 10, "shared") for i in range(10)]
    wl = Workload("shared-prefix", 0, {}, reqs)
    seen: list[int] = []
    step = eng.step

    def counting_step() -> bool:
        seen.append(eng.scheduler.num_running + eng.scheduler.num_waiting + len(eng._inbox))
        return step()

    eng.step = counting_step  # type: ignore[method-assign]
    try:
        records = stepped_loop(
            eng, wl.requests, {r.index: [1, 5, 9, 13, 17, 21][: 2 + r.index % 4] for r in reqs}, 3
        )
    finally:
        eng.shutdown(2.0)
    assert eng._thread is None  # no engine thread: this loop ran every step
    assert [r.index for r in records] == list(range(10)) and all(r.ok for r in records)
    assert [r.num_output_tokens for r in records] == [r.max_tokens for r in reqs]
    assert all(len(r.token_ns) == r.num_output_tokens and r.end_ns == r.token_ns[-1] for r in records)
    # three in flight at every step until the last requests drain: a successor is in before the next step
    assert seen[: len(seen) - 6] and set(seen[: len(seen) - 6]) == {3}
