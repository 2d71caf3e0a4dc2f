"""`kiln bench --metrics`: the engine's speculative-decoding counters around a level, from /metrics text."""

from __future__ import annotations

import pytest

from llmkiln.bench import spec_counters
from llmkiln.bench.report import console_table, markdown_table
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.errors import BadInput

PAGE = """# HELP llmkiln_engine every LLMEngine.metrics() value
# TYPE llmkiln_engine gauge
llmkiln_engine{metric="spec_drafted_tokens",model="llmkiln",version="1"} 40
llmkiln_engine{metric="spec_accepted_tokens",model="llmkiln",version="1"} 30
llmkiln_engine{metric="spec_verifications",model="llmkiln",version="1"} 12
llmkiln_engine{metric="spec_acceptance_rate",model="llmkiln",version="1"} 0.75
llmkiln_engine{metric="num_running",model="llmkiln",version="1"} 0
"""


def test_a_levels_speculation_is_the_difference_of_the_counters():
    before = spec_counters.parse(PAGE)
    assert before == {"spec_drafted_tokens": 40, "spec_accepted_tokens": 30, "spec_verifications": 12}
    after = {"spec_drafted_tokens": 140, "spec_accepted_tokens": 100, "spec_verifications": 52}
    spec = spec_counters.level_delta(before, after)
    assert spec is not None
    assert (spec.drafted_tokens, spec.accepted_tokens, spec.verifications) == (100, 70, 40)
    assert spec.acceptance_rate == pytest.approx(0.7) and spec.mean_accepted_length == pytest.approx(1.75)
    assert spec_counters.level_delta({}, {}) is None  # a server without the counters
    nothing = spec_counters.level_delta(before, before)
    assert nothing is not None and nothing.acceptance_rate is None
    # an engine that does not count them
    assert (spec.free_drafted_tokens, spec.free_accepted_tokens) == (0, 0)
    free = spec_counters.level_delta(
        {"spec_free_drafted_tokens": 8, "spec_free_accepted_tokens": 1},
        {**after, "spec_free_drafted_tokens": 72, "spec_free_accepted_tokens": 9},
    )
    assert free is not None and (free.free_drafted_tokens, free.free_accepted_tokens) == (64, 8)
    history = spec_counters.level_delta(
        {"spec_history_drafted_tokens": 4},
        {**after, "spec_history_drafted_tokens": 40, "spec_history_accepted_tokens": 12},
    )
    assert history is not None
    assert (history.history_drafted_tokens, history.history_accepted_tokens) == (36, 12)


def test_the_report_shows_speculation_only_when_measured():
    from llmkiln.bench.report import RunInfo, make_report

    rec = RequestRecord(index=0, group="g", send_ns=0, token_ns=[10_000_000, 20_000_000], end_ns=20_000_000)
    rec.num_output_tokens = 2
    lv = level_stats(1, [rec])
    run = RunInfo(label="x", workload={"name": "w"}, mode="warm", warmup_requests=0, requests_per_level=1)
    plain = make_report(run, [lv], {1: [rec]})
    assert "spec" not in " ".join(c.header for c in console_table(plain).columns)
    spec = spec_counters.level_delta(
        {}, {"spec_drafted_tokens": 8, "spec_accepted_tokens": 6, "spec_verifications": 3}
    )
    measured = make_report(run, [lv.model_copy(update={"speculative": spec})], {1: [rec]})
    assert "spec\nacc." in [c.header for c in console_table(measured).columns]
    assert "| 0.75 | 2.00 |" in markdown_table(measured)


def test_an_unreachable_metrics_url_is_bad_input_naming_it():
    with pytest.raises(BadInput, match=r"--metrics http://127.0.0.1:9/metrics: cannot read it"):
        spec_counters.scrape(["http://127.0.0.1:9/metrics"], timeout_s=2)


def test_a_report_without_speculation_keeps_its_markdown_columns():
    from llmkiln.bench.report import RunInfo, make_report

    rec = RequestRecord(index=0, group="g", send_ns=0, token_ns=[10_000_000, 20_000_000], end_ns=20_000_000)
    rec.num_output_tokens = 2
    run = RunInfo(label="x", workload={"name": "w"}, mode="warm", warmup_requests=0, requests_per_level=1)
    table = markdown_table(make_report(run, [level_stats(1, [rec])], {1: [rec]}))
    assert "spec" not in table and table.splitlines()[0].endswith("| SLO att. |")
