"""Shutdown is a command the scheduler thread runs between steps: no race with a running step, nothing left
hanging, the runner closed only after the thread ended."""

from __future__ import annotations

import threading

import pytest

from llmkiln.runtime.engine import EngineClosed
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import QueueFull, SamplingParams
from tests.runtime.test_engine_fake import _prompt, make_engine


def _shutdown_with_work_left() -> None:
    eng = make_engine(max_batch_size=1)
    runner, stepping, overlaps = eng.runner, [0], []
    real_execute, real_close = runner.execute, runner.close

    def execute(plan, trace=None):
        stepping[0] += 1
        try:
            return real_execute(plan, trace)
        finally:
            stepping[0] -= 1

    def close():
        overlaps.append(stepping[0])  # steps running while the runner closes: must be none
        real_close()

    runner.execute, runner.close = execute, close
    handles = [eng.submit(_prompt(i), SamplingParams(max_tokens=400)) for i in range(8)]
    eng.start()
    thread = eng._thread
    eng.shutdown(timeout_s=0.0)
    assert thread is not None and not thread.is_alive()
    assert overlaps == [0]  # closed once, with no step running
    assert all(h.finished for h in handles)
    assert {h.finish_reason for h in handles} <= {"cancelled", "length"}
    with pytest.raises(EngineClosed):
        eng.submit(_prompt(1))


def test_shutdown_cancels_what_is_left_200_times_in_a_row():
    # was flaky (2 runs in 5): the stop raced the thread with time.sleep(0) and never checked it ended
    for _ in range(200):
        _shutdown_with_work_left()


def test_shutdown_of_a_never_started_engine_cancels_its_queue():
    eng = make_engine(max_batch_size=1)
    h = eng.submit(_prompt(3), SamplingParams(max_tokens=4))
    eng.shutdown(timeout_s=0.0)
    assert h.finished and h.finish_reason == "cancelled"
    eng.shutdown()  # twice is fine
    with pytest.raises(EngineClosed):
        eng.start()


def test_submissions_racing_the_shutdown_all_end():
    eng = make_engine(max_batch_size=2).start()
    handles, stop = [], threading.Event()

    def submitter() -> None:
        i = 0
        while not stop.is_set():
            try:
                handles.append(eng.submit(_prompt(i), SamplingParams(max_tokens=50)))
            except EngineClosed:
                return
            except QueueFull:
                pass
            i += 1

    t = threading.Thread(target=submitter)
    t.start()
    while len(handles) < 5:
        pass
    eng.shutdown(timeout_s=0.0)
    stop.set()
    t.join()
    assert handles and all(h.finished for h in handles)


@pytest.mark.slow
def test_shutdown_in_the_middle_of_a_real_prefill(engine_factory):
    """The stop command arrives while onnxruntime runs a prefill: the step ends, then the request is cancelled,
    and the runner closes only after that (closing it under a running step was the race)."""
    eng = load_engine(
        engine_factory("stories-fp32"), {"scheduler": {"chunked_prefill": False, "max_num_tokens": 512}}
    )
    runner = eng.runner
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []
    real_execute, real_close = runner.execute, runner.close

    def execute(plan, trace=None):
        if plan.prefills:
            entered.set()
            release.wait(30)  # hold the step until shutdown() is waiting on it
        order.append("execute-start")
        out = real_execute(plan, trace) if trace is not None else real_execute(plan)
        order.append("execute-end")
        return out

    def close():
        order.append("close")
        real_close()

    runner.execute, runner.close = execute, close
    eng.start()
    prompt = [1 + (i * 7) % 500 for i in range(380)]  # one long prefill (chunking off)
    h = eng.submit(prompt, SamplingParams(max_tokens=64))
    assert entered.wait(30)
    stopper = threading.Thread(target=eng.shutdown, kwargs={"timeout_s": 0.0})
    stopper.start()
    while not eng._stop:  # the stop command is posted; the step is still held
        pass
    release.set()
    stopper.join(60)
    assert not stopper.is_alive()
    assert h.finished and h.finish_reason in ("cancelled", "length", "stop"), (h.finish_reason, h.error)
    assert h.error is None
    assert order.index("close") > max(i for i, e in enumerate(order) if e == "execute-end")
    assert order[-1] == "close"
