"""The experiment summary on synthetic reports: changes, targets, peer ratios, plots."""

from __future__ import annotations

import pytest

from llmkiln.bench.peers import ratios
from llmkiln.bench.summary import summarize_experiment


def test_summary_targets_and_ratios(tmp_path, report_factory):
    base = {
        "shared-prefix": report_factory("bench-baseline", {1: [1000, 1000], 8: [10000, 10000, 12000]}),
        "unique": report_factory("bench-baseline", {8: [5000, 5000, 5000]}),
    }
    opt = {
        "shared-prefix": report_factory("bench-optimized", {1: [200, 200], 8: [1000, 1000, 2000]}),
        "unique": report_factory("bench-optimized", {8: [5100, 5100, 5100]}),
    }
    peer = report_factory("onnxruntime-genai-engine", {8: [8000, 8000, 8000]})
    summary, md = summarize_experiment(
        {"wall_s": 60.0},
        "bench-baseline",
        "bench-optimized",
        {"bench-baseline": base, "bench-optimized": opt},
        {"onnxruntime-genai-engine": peer},
        tmp_path,
    )
    t = {(x["workload"], x.get("metric"), x.get("stat")): x for x in summary["targets"]}
    assert t[("shared-prefix", "ttft_ms", "p50")]["change"] == pytest.approx(-0.9)
    assert t[("shared-prefix", "ttft_ms", "p50")]["met"] is True
    assert (
        t[("unique", "ttft_ms", "p50")]["change"] == pytest.approx(0.02)
        and t[("unique", "ttft_ms", "p50")]["met"]
    )
    r = ratios(opt["shared-prefix"], peer, 8)
    assert r["ttft_p50"] == pytest.approx(1000 / 8000)
    assert summary["peers"]["onnxruntime-genai-engine"]["ratios"]["ttft_p50"] == pytest.approx(0.125)
    assert "−80%" in md and "| shared-prefix c=8" in md and "0.12×" in md
    for p in summary["plots"]:
        assert (tmp_path / p).read_bytes()[:4] == b"\x89PNG"
