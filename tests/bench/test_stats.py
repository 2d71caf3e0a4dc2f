"""Statistics on known inputs."""

from __future__ import annotations

import pytest

from llmkiln.bench.stats import RequestRecord, level_stats, summarize

MS = 1_000_000


def rec(i, send, tokens, end, group="g", error=None, cached=None):
    r = RequestRecord(index=i, group=group, send_ns=send * MS, token_ns=[t * MS for t in tokens], error=error)
    r.end_ns = None if end is None else end * MS
    r.num_output_tokens = len(tokens)
    r.num_prompt_tokens = 10
    r.num_cached_tokens = cached
    return r


def test_summarize_known_values():
    d = summarize(range(1, 101))  # 1..100
    assert d.count == 100 and d.mean == 50.5 and d.min == 1 and d.max == 100
    assert d.p50 == pytest.approx(50.5)
    assert d.p90 == pytest.approx(90.1)
    assert d.p95 == pytest.approx(95.05)
    assert d.p99 == pytest.approx(99.01)


def test_summarize_empty_and_none():
    assert summarize([]).count == 0 and summarize([]).p50 is None
    assert summarize([None, 4.0]).p99 == 4.0


def test_level_stats():
    recs = [
        rec(0, 0, [100, 110, 130], 131, cached=64),  # ttft 100, tpot 15, itl 10, 20
        rec(1, 0, [300, 310], 320, group="h", cached=0),  # ttft 300, tpot 10, itl 10
        rec(2, 50, [], None, error="queue full"),
    ]
    lv = level_stats(4, recs)
    assert lv.concurrency == 4 and lv.num_requests == 3 and lv.num_ok == 2 and lv.num_errors == 1
    assert lv.errors == ["queue full"]
    assert lv.ttft_ms.mean == pytest.approx(200) and lv.ttft_ms.p50 == pytest.approx(200)
    assert lv.tpot_ms.mean == pytest.approx(12.5)
    assert sorted([lv.itl_ms.min, lv.itl_ms.max]) == [10, 20] and lv.itl_ms.count == 3
    assert lv.e2e_ms.max == pytest.approx(320)
    assert lv.duration_s == pytest.approx(0.320)
    assert lv.request_throughput == pytest.approx(2 / 0.32)
    assert lv.output_token_throughput == pytest.approx(5 / 0.32)
    assert lv.cached_tokens_mean == 32
    assert set(lv.groups) == {"g", "h"} and lv.groups["h"].ttft_ms.p50 == pytest.approx(300)
    assert lv.groups["g"].num_requests == 2
    assert lv.server_ttft_ms.count == 0


def test_server_fields():
    r = rec(0, 0, [10, 20], 21)
    r.server = {
        "arrival_time_ns": 1_000 * MS,
        "first_scheduled_time_ns": 1_002 * MS,
        "first_token_time_ns": 1_007 * MS,
    }
    lv = level_stats(1, [r])
    assert lv.server_ttft_ms.p50 == pytest.approx(7) and lv.server_queue_ms.p50 == pytest.approx(2)


def test_single_token_has_no_tpot():
    lv = level_stats(1, [rec(0, 0, [5], 6)])
    assert lv.tpot_ms.count == 0 and lv.itl_ms.count == 0 and lv.ttft_ms.p50 == 5
    assert lv.cached_tokens_mean is None
