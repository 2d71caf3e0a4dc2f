"""runtime.profile.ServeStamps: the one builder of a front door's `serve` record (Triton handler, Dynamo worker)."""

from __future__ import annotations

from llmkiln.runtime.profile import ServeStamps


def test_first_stamps_stick_and_the_record_is_in_order() -> None:
    s = ServeStamps(received_ns=100, submit_ns=200)
    s.seen()
    first_seen = s.first_seen_ns
    s.sent()
    first_sent = s.first_sent_ns
    s.seen()
    s.sent()  # later events and chunks do not move the first stamps
    assert (s.first_seen_ns, s.first_sent_ns) == (first_seen, first_sent)
    rec = s.record("r1", 7)
    assert rec["id"] == "r1" and rec["tokens"] == 7
    assert rec["received"] == 100 and rec["submit"] == 200
    assert first_seen is not None and first_sent is not None
    assert first_seen <= first_sent <= rec["done"]  # type: ignore[operator]
    assert "send_us" not in rec and "sends" not in rec  # only where the front door times its sends


def test_unseen_request_and_timed_sends() -> None:
    s = ServeStamps(1, 2)
    rec = s.record("r2", 0)
    assert rec["first_seen"] is None and rec["first_sent"] is None
    s.send(1_500_000)
    s.send(500_000)
    rec = s.record("r2", 2)
    assert rec["send_us"] == 2000 and rec["sends"] == 2
