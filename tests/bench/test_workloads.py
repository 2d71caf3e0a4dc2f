"""Workloads: deterministic per seed, exact token lengths, a real shared prefix (stories260K's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmkiln.bench.workloads import WorkloadSpec, build_workload, count_tokens, load_tokenizer, parse_range
from llmkiln.errors import BadInput

STORIES = Path(__file__).resolve().parents[3] / "shared" / "models" / "stories260K"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(STORIES)


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def spec(name, **kw):
    base = dict(num_requests=12, system_tokens=120, user_tokens=(10, 40), prompt_tokens=(60, 90))
    base.update(long_tokens=200, short_tokens=(8, 24), long_every=4)
    base.update(kw)
    return WorkloadSpec(name=name, **base)


@pytest.mark.parametrize("name", ["shared-prefix", "unique", "mixed-long-short"])
def test_deterministic_per_seed(tok, name):
    a = build_workload(tok, spec(name, seed=3))
    b = build_workload(tok, spec(name, seed=3))
    c = build_workload(tok, spec(name, seed=4))
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]
    assert a.describe() == b.describe()


@pytest.mark.parametrize("name", ["shared-prefix", "unique", "mixed-long-short"])
def test_exact_token_lengths(tok, name):
    w = build_workload(tok, spec(name))
    assert len(w.requests) == 12
    for r in w.requests:
        assert count_tokens(tok, r.prompt) == r.num_prompt_tokens
        assert r.max_tokens == 64


def test_shared_prefix_has_the_system_prompt_as_token_prefix(tok):
    w = build_workload(tok, spec("shared-prefix"))
    first = ids(tok, w.requests[0].prompt)[:120]
    users = set()
    for r in w.requests:
        got = ids(tok, r.prompt)
        assert r.prefix_tokens == 120
        assert got[:120] == first
        assert 120 + 10 <= len(got) <= 120 + 40
        users.add(tuple(got[120:]))
    assert len(users) == len(w.requests)  # every user turn differs


def test_unique_prompts_share_no_block(tok):
    w = build_workload(tok, spec("unique"))
    firsts = {tuple(ids(tok, r.prompt)[:16]) for r in w.requests}
    assert len(firsts) == len(w.requests)


def test_mixed_long_short_groups(tok):
    w = build_workload(tok, spec("mixed-long-short"))
    groups = [r.group for r in w.requests]
    assert groups.count("long") == 3 and groups.count("short") == 9
    assert all(r.num_prompt_tokens == 200 for r in w.requests if r.group == "long")
    assert all(8 <= r.num_prompt_tokens <= 24 for r in w.requests if r.group == "short")


def test_jsonl(tmp_path, tok):
    f = tmp_path / "t.jsonl"
    f.write_text(
        json.dumps({"prompt": "Once upon a time", "max_tokens": 5})
        + "\n\n"
        + json.dumps({"text": "Hi"})
        + "\n"
    )
    w = build_workload(tok, WorkloadSpec(name="jsonl", num_requests=3, jsonl_path=str(f), output_tokens=7))
    assert [(r.prompt, r.max_tokens) for r in w.requests] == [
        ("Once upon a time", 5),
        ("Hi", 7),
        ("Once upon a time", 5),
    ]


@pytest.mark.parametrize(
    "content",
    [
        "not json\n",
        json.dumps({"prompt": ""}) + "\n",
        json.dumps({"prompt": "x", "max_tokens": 0}) + "\n",
        "",
    ],
)
def test_jsonl_bad(tmp_path, content):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(BadInput, match="bad.jsonl"):
        build_workload(None, WorkloadSpec(name="jsonl", num_requests=1, jsonl_path=str(f)))


def test_bad_inputs(tok, tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        build_workload(tok, WorkloadSpec(name="jsonl", jsonl_path=str(tmp_path / "none.jsonl")))
    with pytest.raises(BadInput, match="--tokenizer"):
        build_workload(None, WorkloadSpec(name="unique"))
    with pytest.raises(BadInput, match="unknown workload"):
        build_workload(tok, WorkloadSpec(name="nope"))
    with pytest.raises(BadInput, match="--tokenizer"):
        load_tokenizer(tmp_path)
    assert parse_range("50-200", "x") == (50, 200) and parse_range("7", "x") == (7, 7)
    for bad in ("0", "9-3", "a-b", "1-2-3"):
        with pytest.raises(BadInput):
            parse_range(bad, "--user-tokens")
