"""The TTFT experiment's summary (experiments.ttft_summary) on synthetic reports: changes, targets, peer ratios,
plots."""

from __future__ import annotations

import pytest

from experiments.tradeoff import TradeoffPoint
from experiments.ttft_summary import Extras, summarize_experiment
from llmkiln.bench.floor import FloorResult
from llmkiln.bench.peers import ratios
from llmkiln.bench.profile import LevelProfile
from llmkiln.bench.stats import summarize


def test_summary_targets_and_ratios(tmp_path, report_factory):
    base = {
        "shared-prefix": report_factory("bench-baseline", {1: [1000, 1000], 8: [10000, 10000, 12000]}),
        "unique": report_factory("bench-baseline", {8: [5000, 5000, 5000]}),
    }
    opt = {
        "shared-prefix": report_factory("bench-optimized", {1: [200, 200], 8: [1000, 1000, 2000]}),
        "unique": report_factory("bench-optimized", {8: [5100, 5100, 5100]}),
    }
    # the floor of the c=1 target: the server's own suffix prefill runs (step profile), p50 170 ms
    opt["shared-prefix"].profile["1"] = LevelProfile.model_construct(own_prefill_ms=summarize([150.0, 190.0]))
    peer = report_factory("onnxruntime-genai-engine", {8: [8000, 8000, 8000]})
    summary, md = summarize_experiment(
        {"wall_s": 60.0},
        "bench-baseline",
        "bench-optimized",
        {"bench-baseline": base, "bench-optimized": opt},
        {"onnxruntime-genai-engine": peer},
        tmp_path,
        Extras(
            floor=FloorResult(
                requests=2,
                prefill_ms=summarize([150.0, 190.0]),
                suffix_tokens=summarize([110, 112]),
                cached_tokens=summarize([1488, 1488]),
                ttft_ms=summarize([200.0, 200.0]),
                ratio_p50=200.0 / 170.0,
                ratios=summarize([200.0 / 150.0, 200.0 / 190.0]),
            ),
            tradeoff=[
                TradeoffPoint(
                    setting="decode-first",
                    ttft_first=False,
                    tpot_slo_ms=None,
                    concurrency=8,
                    requests=16,
                    errors=0,
                    ttft_p50=900.0,
                    ttft_p95=1200.0,
                    tpot_p50=40.0,
                    tpot_p95=50.0,
                    itl_p95=60.0,
                    output_tokens_per_s=80.0,
                ),
            ],
        ),
    )
    absolute = {(x["concurrency"], x["metric"], x["stat"]): x for x in summary["targets"] if "value" in x}
    assert absolute[(8, "ttft_ms", "p50")]["value"] == pytest.approx(1000.0)
    assert absolute[(8, "ttft_ms", "p50")]["met"] is False  # 1000 ms > 500 ms
    assert absolute[(1, "ttft_over_floor", "p50")]["met"] is False  # 200 / 170 = 1.18 > 1.1
    assert "TTFT vs TPOT" in md and "| decode-first | 8 | 900 |" in md and "| 1.18× | no |" in md
    assert "Cross-check" in md  # the in-process re-run is shown, not used for the target
    t = {(x["workload"], x.get("metric"), x.get("stat")): x for x in summary["targets"] if "change" in x}
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
