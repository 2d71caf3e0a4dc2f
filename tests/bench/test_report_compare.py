"""Report JSON schema round trip, compare math, plots and Markdown."""

from __future__ import annotations

import json

import pytest

from llmkiln.bench.compare import compare, find, rel_change
from llmkiln.bench.plots import bars, ttft_cdf
from llmkiln.bench.report import load_report, markdown_report, save_report
from llmkiln.errors import BadInput


def test_report_roundtrip_and_schema(tmp_path, report_factory):
    rep = report_factory("base", {1: [100, 200, 300], 4: [400, 500, 600]})
    path = tmp_path / "r.json"
    save_report(rep, path)
    data = json.loads(path.read_text())
    assert data["schema"] == "llmkiln.bench/1"
    lv = data["levels"][0]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(lv[key]) == {"count", "mean", "min", "max", "p50", "p90", "p95", "p99"}
    for key in ("request_throughput", "output_token_throughput", "num_errors", "concurrency", "duration_s"):
        assert key in lv
    assert data["run"]["machine"]["cpus"] >= 1
    assert data["ttft_samples_ms"]["4"] == [400, 500, 600]
    back = load_report(path)
    assert back == rep
    assert "| conc |" in markdown_report(back)


def test_load_report_bad(tmp_path):
    with pytest.raises(BadInput, match="no such report"):
        load_report(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other", "run": {}, "levels": []}))
    with pytest.raises(BadInput, match="bad.json"):
        load_report(bad)


def test_compare_math(report_factory):
    fake_report = report_factory
    assert rel_change(100, 20) == pytest.approx(-0.8)
    assert rel_change(0, 5) is None
    a = fake_report("a", {1: [100, 200, 300], 8: [1000, 1000, 1000]})
    b = fake_report("b", {1: [50, 100, 150], 8: [200, 200, 200], 16: [1, 2, 3]})
    ch = compare(a, b)
    assert {x.concurrency for x in ch} == {1, 8}
    assert find(ch, 1, "ttft_ms", "p50").change == pytest.approx(-0.5)
    assert find(ch, 8, "ttft_ms", "mean").change == pytest.approx(-0.8)
    assert find(ch, 8, "ttft_ms", "p95").a == pytest.approx(1000)
    thr = find(ch, 8, "output_token_throughput", "value")
    assert thr.change == pytest.approx(thr.b / thr.a - 1)


def test_plots(tmp_path, report_factory):
    fake_report = report_factory
    a = fake_report("a", {1: [100, 200, 300], 8: [1000, 1100, 1200]})
    b = fake_report("b", {1: [50, 100, 150], 8: [200, 250, 300]})
    p1 = ttft_cdf({"a": a, "b": b}, tmp_path / "cdf.png")
    p2 = bars({"a": a, "b": b}, tmp_path / "bars.png", stats=("p50", "p95"))
    p3 = bars({"a": a, "b": b}, tmp_path / "thr.png", metric="output_token_throughput", stats=("value",))
    for p in (p1, p2, p3):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
