"""Crafted request sets: the findings, and the computed hit rates (before and after each fix) equal what the
real runtime's prefix store hits when it serves the same requests one after another (stories260K engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmkiln.engine_dir import EngineDir
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.lint import lint_prompts
from llmkiln.lint.prefix_sim import simulate_hits
from llmkiln.lint.requests import PromptRequest, read_requests
from tests.lint.runtime_helpers import served_cached, write_jsonl

SYSTEM = (
    "You are a storyteller for small children. Tell short, happy stories about a cat, a dog and a bird "
    "who live in a little house near the sea. Use simple words."
)
QUESTIONS = [
    "A story about a red ball.",
    "What did the dog find?",
    "Tell me about the bird's song.",
    "The cat goes to the market.",
    "A rainy day at the house.",
    "Who made the big cake?",
]


def _check_exact(folder: EngineDir, requests: list[PromptRequest], overrides=None) -> list[int]:
    """Simulated cached tokens == the runtime's prefix-store hits, request by request; returns them.

    The prediction counts whole cached blocks (what any slot or worker can reuse). A slot that still holds its
    last prompt (kv_cache.slot_reuse) may serve a few more tokens beyond the last whole block: the prediction is
    a floor there, and equal with slot reuse off."""
    enc = PromptEncoder.from_engine(folder)
    recipe = folder.recipe(overrides)
    sim = simulate_hits(
        enc.encode_requests(requests, [enc.render(r) for r in requests]),
        recipe.kv_cache.tokens_per_block,
        recipe.limits.max_input_len,
    )
    store_only = {**(overrides or {})}
    store_only["kv_cache"] = {**store_only.get("kv_cache", {}), "slot_reuse": False}
    served = served_cached(folder, requests, store_only)
    assert sim.cached == served
    with_slots = served_cached(folder, requests, overrides)
    assert all(s >= p for s, p in zip(with_slots, sim.cached, strict=True)), (with_slots, sim.cached)
    return served


def _rate(cached: list[int], folder: EngineDir, requests: list[PromptRequest]) -> float:
    enc = PromptEncoder.from_engine(folder)
    total = sum(len(x) for x in enc.encode_requests(requests, [enc.render(r) for r in requests]))
    return sum(cached) / total


def _lint(tmp_path: Path, folder: EngineDir, rows: list[dict]):
    path = write_jsonl(tmp_path / "requests.jsonl", rows)
    fixed_path = tmp_path / "fixed.jsonl"
    report, fixed = lint_prompts(path, folder, fixed_path)
    assert read_requests(fixed_path) == fixed or [r.to_json() for r in read_requests(fixed_path)] == [
        r.to_json() for r in fixed
    ]
    return report, read_requests(path), fixed


def test_timestamp_in_the_system_prompt(tmp_path: Path, stories_engine: EngineDir) -> None:
    rows = [
        {
            "messages": [
                {"role": "system", "content": f"Current time: 2026-11-30T12:0{i}:{17 + i}Z\n{SYSTEM}"},
                {"role": "user", "content": q},
            ]
        }
        for i, q in enumerate(QUESTIONS)
    ]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    causes = [f.cause for f in report.findings]
    assert causes[0] == "dynamic-content" and "timestamps" in report.findings[0].title
    assert report.findings[0].requests == [1, 2, 3, 4, 5, 6]
    before = _check_exact(stories_engine, requests)
    after = _check_exact(stories_engine, fixed)
    assert report.baseline.token_hit_rate == pytest.approx(_rate(before, stories_engine, requests), abs=1e-6)
    assert report.findings[0].after.token_hit_rate == pytest.approx(
        _rate(after, stories_engine, fixed), abs=1e-6
    )
    assert report.findings[0].after.token_hit_rate > report.baseline.token_hit_rate + 0.3
    # the timestamp now opens the user turn; the system prompt is the same for everyone
    assert {r.messages[0][1] for r in fixed} == {SYSTEM}
    assert fixed[0].messages[1][1].startswith("Current time: 2026-11-30T12:00:17Z\n")


def test_trailing_whitespace_variants(tmp_path: Path, stories_engine: EngineDir) -> None:
    # one template, its first line ended four ways: the variants share nothing past that line
    first, rest = SYSTEM.split(". ", 1)
    endings = ["\n", "\n", " \n", "\n\n", "\n", "  \n"]
    rows = [
        {"prompt": f"{first}.{end}{rest}\nUser: {q}\nStory:"}
        for end, q in zip(endings, QUESTIONS, strict=True)
    ]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    ws = next(f for f in report.findings if f.cause == "whitespace-variants")
    assert ws.requests == [3, 4, 6]
    before = _check_exact(stories_engine, requests)
    after = _check_exact(stories_engine, fixed)
    assert report.baseline.hit_tokens == sum(before)
    assert ws.after.hit_tokens == sum(after) > sum(before)
    assert all(r.prompt.startswith(f"{first}.\n{rest}\nUser: ") for r in fixed)


def test_duplicated_bos(tmp_path: Path, stories_engine: EngineDir) -> None:
    rows = [{"prompt": ("<s>" if i % 2 else "") + f"{SYSTEM}\nUser: {q}"} for i, q in enumerate(QUESTIONS)]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    variants = next(f for f in report.findings if f.cause == "bos-variants")
    assert variants.requests == [2, 4, 6] and variants.in_fix_output
    enc = PromptEncoder.from_engine(stories_engine)
    assert enc.leading_bos(enc.encode_texts([enc.render(requests[1])])[0]) == 2
    before = _check_exact(stories_engine, requests)
    after = _check_exact(stories_engine, fixed)
    assert report.baseline.hit_tokens == sum(before)
    assert variants.after.hit_tokens == sum(after) > sum(before)


def test_shared_part_shorter_than_one_block(tmp_path: Path, stories_engine: EngineDir) -> None:
    rows = [{"prompt": f"Once upon a time, {q}"} for q in QUESTIONS]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    short = next(f for f in report.findings if f.cause == "short-shared-part")
    assert short.recipe_field == "kv_cache.tokens_per_block" and not short.in_fix_output
    assert report.baseline.hit_tokens == 0 == sum(_check_exact(stories_engine, requests))
    new_bs = int(report.recipe_changes["kv_cache.tokens_per_block"])
    assert new_bs < 16
    overrides = {"kv_cache": {"tokens_per_block": new_bs}}
    assert short.after.hit_tokens == sum(_check_exact(stories_engine, fixed, overrides)) > 0


def test_user_names_in_the_system_prompt(tmp_path: Path, stories_engine: EngineDir) -> None:
    names = ["Alice", "Bob", "Maria Lopez", "Tom", "Anna", "Li Wei"]
    rows = [
        {"messages": [{"role": "system", "content": f"Hello {n}! {SYSTEM}"}, {"role": "user", "content": q}]}
        for n, q in zip(names, QUESTIONS, strict=True)
    ]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    dyn = report.findings[0]
    assert dyn.cause == "dynamic-content" and "user names" in dyn.title
    assert dyn.after.hit_tokens == sum(_check_exact(stories_engine, fixed)) > report.baseline.hit_tokens


def test_join_between_shared_part_and_user_text(tmp_path: Path, stories_engine: EngineDir) -> None:
    # A shared part ending in a space whose lone '▁' token closes a block: in every prompt that '▁' merges with
    # the user's first word, so the block it closes is never shared.
    enc = PromptEncoder.from_engine(stories_engine)
    shared = "Answer the question about the story. "
    words = iter("the cat and the dog play in the sun by the sea every day".split() * 4)
    while len(enc.encode_texts([shared])[0]) % 16:
        shared = shared[:-1] + f" {next(words)} "
    # lower-case first words: this tokenizer has '▁a', '▁w', '▁t', ... but no '▁A', '▁W'
    rows = [{"prompt": f"{shared}{q[0].lower()}{q[1:]}"} for q in QUESTIONS]
    report, requests, fixed = _lint(tmp_path, stories_engine, rows)
    join = next(f for f in report.findings if f.cause == "join-tokenization")
    assert join.requests == [1, 2, 3, 4, 5, 6]
    before = _check_exact(stories_engine, requests)
    after = _check_exact(stories_engine, fixed)
    assert report.baseline.hit_tokens == sum(before)
    assert join.after.hit_tokens == sum(after) > sum(before)


def test_clean_requests_have_no_findings(tmp_path: Path, stories_engine: EngineDir) -> None:
    rows = [
        {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
        for q in QUESTIONS
    ]
    report, requests, _ = _lint(tmp_path, stories_engine, rows)
    assert report.findings == []
    # the bundled chat template writes {{ bos_token }}; rendered chat is tokenized without adding it again
    enc = PromptEncoder.from_engine(stories_engine)
    assert enc.leading_bos(enc.encode_requests(requests[:1], [enc.render(requests[0])])[0]) == 1
    assert report.baseline.hit_tokens == sum(_check_exact(stories_engine, requests)) > 0
