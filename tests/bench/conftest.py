"""Shared helpers for the bench tests."""

from __future__ import annotations

import pytest

from llmkiln.bench.report import RunInfo, make_report
from llmkiln.bench.stats import RequestRecord, level_stats

MS = 1_000_000


def fake_report(label, ttfts, tokens=4):
    records = {}
    for c, values in ttfts.items():
        recs = []
        for i, t in enumerate(values):
            r = RequestRecord(
                index=i, group="shared", send_ns=0, token_ns=[(t + 10 * k) * MS for k in range(tokens)]
            )
            r.end_ns = r.token_ns[-1]
            r.num_output_tokens = tokens
            recs.append(r)
        records[c] = recs
    levels = [level_stats(c, recs) for c, recs in records.items()]
    run = RunInfo(
        label=label,
        workload={"name": "shared-prefix", "seed": 0, "params": {}},
        mode="warm",
        warmup_requests=1,
        requests_per_level=len(next(iter(ttfts.values()))),
    )
    return make_report(run, levels, records)


@pytest.fixture
def report_factory():
    return fake_report
