"""`kiln bench soak` on the real engine for a few seconds: the report is complete and nothing leaks."""

from __future__ import annotations

import pytest

from llmkiln.bench.soak import LEAK_METRICS, run_soak

pytestmark = pytest.mark.slow


def test_short_soak_reports_no_errors_and_no_leaks(engine_factory):
    report = run_soak(engine_factory("stories-fp32"), minutes=0.1, concurrency=2, max_tokens=8)
    assert report.requests > 10 and report.failed == 0, report.text()
    assert set(report.leaks) == set(LEAK_METRICS) and report.ok, report.text()
    assert report.p99_ms_first > 0 and report.p99_ms_last > 0 and report.rss_mb_end > 0
    assert "leaked at rest" in report.text()
