"""ServeCore with triton_python_backend_utils stubbed and the stand-in engine (no server)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from llmkiln.host.engine_host import EngineHost
from llmkiln.recipe import Warmup
from llmkiln.serve.handler import ServeCore, ServeSettings, StubLog

from . import pb_stub as pb
from .fake_engine import ByteTokenizer, FakeEngine


def core(warmup: Warmup | None = None, exclude_input_default: bool = False) -> ServeCore:
    settings = ServeSettings("fake", Path("/nonexistent"), warmup, exclude_input_default)
    c = ServeCore(pb, EngineHost(FakeEngine().start(), log=StubLog(pb)), settings)
    c.warm()
    return c


def published(c: ServeCore, attr: str) -> float:
    """The value Triton's metrics endpoint shows for a host metric."""
    c.published.publish(c.host.refresh_metrics())
    return c.published.metrics[attr].value


def req(prompt: str = "héllo", max_tokens: int = 5, **extra) -> pb.Request:
    inputs = {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], np.int32),
    }
    inputs.update({k: np.array([[v]]) for k, v in extra.items()})
    return pb.Request(**inputs)


def run(c: ServeCore, *requests: pb.Request) -> None:
    asyncio.run(c.execute(list(requests)))


def test_non_streaming_gets_one_final_response_with_prompt():
    c, r = core(), req("abc", 4)
    run(c, r)
    assert len(r.sender.sent) == 1 and r.sender.final
    assert r.sender.texts() == ["abcabca"]


def test_exclude_input_default_from_config():
    c, r = core(exclude_input_default=True), req("abc", 4)
    run(c, r)
    assert r.sender.texts() == ["abca"]


def test_streaming_never_splits_a_utf8_character():
    c, r = core(), req("é€", 5, stream=True)
    run(c, r)
    parts = r.sender.texts()
    assert "".join(parts) == "é€"  # 5 byte tokens = exactly the two characters
    assert all("\ufffd" not in p for p in parts) and r.sender.final


def test_stop_words_cut_the_text():
    c = core(exclude_input_default=True)
    r = req("abcd", 30, stream=True)
    r.inputs["stop_words"] = np.array([[b"da"]], dtype=object)
    run(c, r)
    assert "".join(r.sender.texts()) == "abc" and r.sender.final


def test_perf_fields_on_request():
    c, r = core(), req("hello", 3, return_perf_metrics=True, exclude_input_in_output=True)
    run(c, r)
    resp = r.sender.sent[-1][0]
    assert resp.out("num_output_tokens")[0, 0] == 3 and resp.out("num_input_tokens")[0, 0] == 5
    assert resp.out("first_token_time_ns")[0, 0] >= resp.out("arrival_time_ns")[0, 0] > 0


@pytest.mark.parametrize(
    "request_, message",
    [
        (req("x", 0), "max_tokens"),
        (req("x" * 300, 3), "request rejected: prompt has 300 tokens"),
        (req("x", 3, top_p=2.0), "top_p"),
    ],
)
def test_errors_are_final_triton_errors(request_, message):
    c = core()
    run(c, request_)
    assert request_.sender.final and message in request_.sender.errors()[0]
    assert published(c, "rejected") == 1


def test_many_requests_in_flight():
    c = core()
    rs = [req(f"p{i}", 8, stream=True) for i in range(16)]
    run(c, *rs)
    assert all(r.sender.final for r in rs)
    assert ["".join(r.sender.texts()) for r in rs] == [(f"p{i}" * 8)[:8] for i in range(16)]


def test_cancelled_request_ends_with_a_final_flag():
    c = core()
    r = req("abc", 100, stream=True)
    r.cancel_after = 1
    run(c, r)
    assert r.sender.final and len(r.sender.texts()) < 100
    assert not r.sender.errors() and published(c, "cancelled") == 1  # the cancel path, not an internal error


def test_warmup_runs_in_the_host_before_the_model_takes_requests():
    pb.Logger.lines.clear()
    c = core(warmup=Warmup(prompts=["warm"], count=2, max_tokens=2))
    assert c.host.health().ready
    assert published(c, "warmup_requests") == 2 and published(c, "warmup_seconds") > 0
    assert any("warmup done: 2 requests" in ln for ln in pb.Logger.lines)
    run(c, req("user", 2))
    assert published(c, "warmup_requests") == 2
    assert published(c, "prompt_tokens") == 4 and len(c.published.metrics["ttft_ms"].observed) == 1


def test_a_failed_warmup_fails_initialize():
    with pytest.raises(Exception, match="warmup text 0"):
        core(warmup=Warmup(prompts=["x" * 300], count=1))


def test_draining_answers_new_requests_unavailable_at_once(tmp_path: Path):
    drain = tmp_path / "drain"
    settings = ServeSettings("fake", Path("/nonexistent"), drain_file=drain)
    c = ServeCore(pb, EngineHost(FakeEngine().start(), log=StubLog(pb)), settings)
    run(c, r := req("before", 3))
    assert r.sender.texts() == ["beforebef"]
    drain.write_text(str(time.time() + 60))
    run(c, late := req("after", 3))
    assert late.sender.final and "shutting down" in late.sender.errors()[0]
    assert late.sender.sent[0][0].error.code == pb.TritonError.UNAVAILABLE
    assert published(c, "rejected") == 1 and published(c, "succeeded") == 1


def test_requests_running_at_the_drain_deadline_end_with_a_final_error(tmp_path: Path):
    drain = tmp_path / "drain"
    c = ServeCore(pb, EngineHost(FakeEngine().start()), ServeSettings("fake", Path("/x"), drain_file=drain))

    async def scenario() -> list[pb.Request]:
        long = [req(f"long {i}", 100_000, stream=True) for i in range(3)]
        task = asyncio.ensure_future(c.execute(long))
        while not all(r.sender.sent for r in long):
            await asyncio.sleep(0.005)
        drain.write_text(str(time.time() + 0.2))  # the deadline: 0.2 s from now
        await asyncio.wait_for(task, 10)
        return long

    long = asyncio.run(scenario())
    for r in long:
        assert r.sender.final and "did not finish within the exit timeout" in r.sender.errors()[-1]
    assert published(c, "failed") == 3 and published(c, "succeeded") == 0 and published(c, "active") == 0


class SlowTokenizer(ByteTokenizer):
    """encode_batch blocks its thread for a while (as a huge prompt would); it must not stall the loop."""

    def encode_batch(self, texts, add_special_tokens=True):
        if texts[0].startswith("huge"):
            time.sleep(0.5)
        return super().encode_batch(texts, add_special_tokens)


def test_tokenization_runs_off_the_event_loop():
    engine = FakeEngine().start()
    engine.tokenizer = SlowTokenizer()
    c = ServeCore(pb, EngineHost(engine), ServeSettings("fake", Path("/x")))
    order: list[str] = []

    async def scenario() -> None:
        huge, small = req("huge prompt", 2), req("small", 2)
        await asyncio.gather(c.handle(huge), c.handle(small))
        order.extend(["huge", "small"] if huge.sender.done_at < small.sender.done_at else ["small", "huge"])

    asyncio.run(scenario())
    assert order == ["small", "huge"]  # the small request finished while the huge one was being tokenized


def _cancel_req(target: str, key: str) -> pb.Request:
    r = req("", 1)
    r.params = {"llmkiln_cancel": target, "llmkiln_cancel_key": key}
    return r


def test_in_band_cancel_stops_the_named_request(monkeypatch: pytest.MonkeyPatch):
    # the gRPC front's cancel (llmkiln.serve.grpc_front): Triton never sees the client's cancellation
    monkeypatch.setenv("LLMKILN_CANCEL_KEY", "k3y")
    c = core()
    long = req("abc", 5000, stream=True)
    long.rid = "g0-0"
    cancel = _cancel_req("g0-0", "k3y")

    async def scenario() -> None:
        task = asyncio.ensure_future(c.execute([long]))
        await asyncio.sleep(0.05)
        await c.execute([cancel])
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert long.sender.final and len(long.sender.texts()) < 100
    assert sum(1 for _, f in long.sender.sent if f & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL) == 1
    assert cancel.sender.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    assert c.metrics.values["cancelled"] == 1 and not c.by_id


def test_in_band_cancel_before_submit_is_remembered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LLMKILN_CANCEL_KEY", "k3y")
    c = core()
    run(c, _cancel_req("g1-0", "k3y"))
    late = req("abc", 5000, stream=True)
    late.rid = "g1-0"
    run(c, late)
    assert late.sender.final and len(late.sender.texts()) < 5 and c.metrics.values["cancelled"] == 1


def test_cancel_parameter_without_the_key_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LLMKILN_CANCEL_KEY", "k3y")
    c = core()
    bad = _cancel_req("g0-0", "guess")
    run(c, bad)
    assert bad.sender.final and "reserved" in bad.sender.errors()[0]
    monkeypatch.delenv("LLMKILN_CANCEL_KEY")  # no gRPC front: no key, every cancel message is refused
    bad = _cancel_req("g0-0", "")
    run(c, bad)
    assert bad.sender.final and bad.sender.errors()


def test_response_stream_sends_exactly_one_final():
    from llmkiln.serve.response_stream import ResponseStream

    a, b, c = pb.InferenceResponse(), pb.InferenceResponse(), pb.InferenceResponse()
    sender = pb.Sender()
    s = ResponseStream(sender, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    s.send(a)
    s.send(b, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    s.send(c)
    s.finish()
    assert [r for r, _ in sender.sent] == [a, b] and s.dropped == 1
    t = ResponseStream(pb.Sender(), pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    t.finish()
    t.finish()
    assert t.sender.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]


def test_an_exception_still_ends_the_request_once():
    c = core()
    r = req("abc", 4, stream=True)

    async def boom(*args, **kwargs):
        raise RuntimeError("boom")

    c._stream = boom  # type: ignore[method-assign]
    run(c, r)
    finals = [f for _, f in r.sender.sent if f & pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
    assert len(finals) == 1 and "internal error" in r.sender.errors()[0]
