"""runtime/run_padding.py: which runs get padding, and how much."""

from __future__ import annotations

import pytest

from llmkiln.errors import BadInput
from llmkiln.runtime.run_padding import ENV, LIMIT, MAX_ENV, MAX_TOKENS, WINDOW, RunPadding, from_env


def test_a_run_a_few_tokens_short_of_the_recent_ones_is_padded_to_their_count():
    p = RunPadding()
    assert p.pad(5) == 0  # the first run: nothing to match
    assert [p.pad(n) for n in (1, 3, 5, 2)] == [4, 2, 0, 3]  # speculation's 1..5 tokens all run as 5
    assert (p.padded_runs, p.padding_tokens) == (3, 9)


def test_no_padding_beyond_the_limit_or_above_the_recent_counts():
    p = RunPadding()
    p.pad(512)  # a prefill run
    assert p.pad(8) == 0  # 504 short: never padded
    p.pad(7)
    assert p.pad(5) == 3  # to the 8 before it: the prefill run among the recent ones does not stop it
    assert p.pad(12) == 0 and p.pad(10) == 0  # beyond MAX_TOKENS: extra tokens cost what a change does
    q = RunPadding()
    q.pad(1)
    assert q.pad(6) == 0  # a bigger run: runs as is
    assert q.pad(6 - LIMIT - 1) == 0 and q.pad(6 - LIMIT) == LIMIT
    assert MAX_TOKENS >= 1 + LIMIT  # speculation's 1 + 4 drafts at one sequence stay padded


def test_a_count_not_seen_for_a_window_of_runs_is_let_go():
    p = RunPadding()
    p.pad(5)
    assert [p.pad(1) for _ in range(WINDOW)] == [4] * WINDOW  # the 5 is among the last WINDOW runs
    assert p.pad(1) == 0


def test_limit_zero_turns_it_off_and_bad_settings_are_refused():
    p = RunPadding(limit=0)
    p.pad(5)
    assert p.pad(1) == 0
    with pytest.raises(ValueError):
        RunPadding(limit=-1)
    with pytest.raises(ValueError):
        RunPadding(window=0)


def test_the_environment_sets_the_limit(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert from_env().limit == LIMIT
    monkeypatch.setenv(ENV, "0")
    assert from_env().limit == 0
    monkeypatch.setenv(ENV, "four")
    with pytest.raises(BadInput, match="LLMKILN_RUN_PADDING"):
        from_env()
    monkeypatch.setenv(ENV, "16")
    monkeypatch.delenv(MAX_ENV, raising=False)
    assert (from_env().limit, from_env().max_tokens) == (16, MAX_TOKENS)
    monkeypatch.setenv(MAX_ENV, "20")
    assert from_env().max_tokens == 20
    monkeypatch.setenv(MAX_ENV, "lots")
    with pytest.raises(BadInput, match="LLMKILN_RUN_PADDING_MAX"):
        from_env()


def test_speculation_pads_a_lone_sequence_to_one_plus_its_draft_length(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(MAX_ENV, raising=False)
    p = from_env()
    assert p.for_drafts(8) is True  # a lone sequence's drafts ride free
    assert (p.limit, p.max_tokens) == (8, 9)
    p.pad(9)  # a sequence verifying 8 drafts
    assert [p.pad(n) for n in (1, 4, 9)] == [8, 5, 0]  # every run of one sequence at 9
    assert p.pad(10) == 0 and p.pad(18) == 0  # two sequences' drafts: beyond it, as before
    small = from_env()
    small.for_drafts(2)  # never below the defaults
    assert (small.limit, small.max_tokens) == (LIMIT, MAX_TOKENS)


def test_speculation_leaves_padding_set_by_the_environment_or_turned_off(monkeypatch):
    monkeypatch.setenv(ENV, "2")
    monkeypatch.delenv(MAX_ENV, raising=False)
    p = from_env()
    assert p.for_drafts(8) is False  # runs of 1 + 8 are not padded: drafts are priced by the scheduler
    assert (p.limit, p.max_tokens) == (2, MAX_TOKENS)
    off = RunPadding(limit=0)
    assert off.for_drafts(8) is False
    assert off.limit == 0
