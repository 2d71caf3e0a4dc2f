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


# chat-multiturn

# SmolLM2-135M-Instruct's template (ChatML): what EngineDir(engine).chat_template() gives for smollm2-fp32
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat(template=CHATML, **kw):
    base = dict(
        num_requests=24,
        system_tokens=100,
        user_tokens=(10, 20),
        assistant_tokens=12,
        num_conversations=3,
        num_turns=4,
        output_tokens=16,
        chat_template=template,
    )
    base.update(kw)
    return WorkloadSpec(name="chat-multiturn", **base)


def test_chat_multiturn_is_deterministic_per_seed(tok):
    a = build_workload(tok, chat(seed=3))
    b = build_workload(tok, chat(seed=3))
    c = build_workload(tok, chat(seed=4))
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]
    assert a.describe() == b.describe()
    p = a.describe()["params"]
    assert (p["num_conversations"], p["num_turns"], p["assistant_tokens"], p["system_tokens"]) == (
        3,
        4,
        12,
        100,
    )
    assert (
        p["chat_template_sha256"]
        != build_workload(tok, chat(template=None)).describe()["params"]["chat_template_sha256"]
    )


def test_chat_multiturn_order_rounds_and_groups(tok):
    w = build_workload(tok, chat())
    assert len(w.requests) == 24 and [r.index for r in w.requests] == list(range(24))
    # two rounds of 3 conversations x 4 turns, each interleaved turn by turn
    assert [r.group for r in w.requests] == [
        f"turn-{t}" for _ in range(2) for t in (1, 2, 3, 4) for _ in range(3)
    ]
    assert all(r.max_tokens == 16 for r in w.requests)
    # cut at num_requests
    assert [r.prompt for r in build_workload(tok, chat(num_requests=7)).requests] == [
        r.prompt for r in w.requests[:7]
    ]


def _conversations(w, n_conv=3, n_turns=4):
    """{(round, conversation): [prompt of turn 1, ..., turn T]} from the documented order."""
    out: dict[tuple[int, int], list[str]] = {}
    for i, r in enumerate(w.requests):
        rnd, rest = divmod(i, n_conv * n_turns)
        out.setdefault((rnd, rest % n_conv), []).append(r.prompt)
    return out


@pytest.mark.parametrize("template", [CHATML, None])
def test_chat_multiturn_each_turn_extends_the_previous_one(tok, template):
    w = build_workload(tok, chat(template=template))
    convs = _conversations(w)
    assert len(convs) == 6 and all(len(p) == 4 for p in convs.values())
    for prompts in convs.values():
        for a, b in zip(prompts, prompts[1:], strict=False):
            assert b.startswith(a) and len(b) > len(a)  # byte-for-byte: the prefix cache can reuse turn t
            ia, ib = ids(tok, a), ids(tok, b)
            assert ib[: len(ia)] == ia  # and token for token: the cache reuses whole blocks of turn t
    first_turns = [p[0] for p in convs.values()]
    assert len(set(first_turns)) == len(first_turns)  # every conversation is its own


def test_chat_multiturn_system_prefix_and_token_counts(tok):
    w = build_workload(tok, chat())
    head = w.requests[0].prompt[: w.requests[0].system_chars]
    assert head.startswith("<|im_start|>system\n") and head.endswith("<|im_end|>\n")
    head_ids = ids(tok, head)
    for r in w.requests:
        got = ids(tok, r.prompt)
        assert r.num_prompt_tokens == len(got) == count_tokens(tok, r.prompt)
        assert r.prompt[: r.system_chars] == head and r.split_system()[0] == head
        assert r.prefix_tokens == len(head_ids) and got[: r.prefix_tokens] == head_ids
        assert r.prompt.endswith("<|im_start|>assistant\n")
    # turn t: the system part, t user turns of 10-20 tokens, t-1 replies of 12, plus the template's markup
    markup = count_tokens(tok, "<|im_start|>user\n<|im_end|>\n")
    reply = count_tokens(tok, "<|im_start|>assistant\n<|im_end|>\n")
    for r in w.requests:
        t = int(r.group.removeprefix("turn-"))
        rest = r.num_prompt_tokens - r.prefix_tokens - count_tokens(tok, "<|im_start|>assistant\n")
        lo = t * 10 + (t - 1) * 12 + t * markup + (t - 1) * reply
        assert lo - 2 * t <= rest <= lo + t * 10 + 2 * t  # ± a token per seam


def test_chat_multiturn_contents_have_the_asked_lengths(tok):
    from llmkiln.bench.workloads import chat_conversations

    spec = chat()
    system, convs = chat_conversations(tok, spec, 3)
    assert count_tokens(tok, system) == 100
    assert system == chat_conversations(tok, spec, 3)[0]
    for conv in convs:
        assert len(conv.users) == len(conv.replies) == 4
        assert all(10 <= count_tokens(tok, u) <= 20 for u in conv.users)
        assert all(count_tokens(tok, a) == 12 for a in conv.replies)
        roles = [m["role"] for m in conv.messages(system, 3)]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


def test_chat_multiturn_bad_sizes(tok):
    for kw in ({"num_turns": 0}, {"num_conversations": 0}, {"assistant_tokens": 0}):
        with pytest.raises(BadInput, match="chat-multiturn"):
            build_workload(tok, chat(**kw))
    with pytest.raises(BadInput, match="system message"):
        build_workload(tok, chat(template="{% for m in messages %}{{ m['content'] }}{% endfor %}!"))


def test_spread_draws_lengths_and_keeps_the_prompts(tok):
    base = WorkloadSpec(num_requests=40, output_tokens=32, system_tokens=64, user_tokens=(8, 16))
    same = build_workload(tok, base)
    spread = build_workload(tok, WorkloadSpec(**{**base.__dict__, "output_spread": 16}))
    assert {r.max_tokens for r in same.requests} == {32}
    lengths = [r.max_tokens for r in spread.requests]
    assert min(lengths) >= 16 and max(lengths) <= 48 and len(set(lengths)) > 10
    assert [r.prompt for r in spread.requests] == [r.prompt for r in same.requests]
    assert spread.params["output_spread"] == 16 and "output_spread" not in same.params
    again = build_workload(tok, WorkloadSpec(**{**base.__dict__, "output_spread": 16}))
    assert [r.max_tokens for r in again.requests] == lengths  # deterministic


def test_a_spread_that_reaches_zero_is_refused(tok):
    with pytest.raises(BadInput, match="output spread 32"):
        build_workload(tok, WorkloadSpec(output_tokens=32, output_spread=32))
