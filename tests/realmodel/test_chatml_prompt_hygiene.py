"""`kiln lint-prompts` and `kiln diagnose` on the real model's ChatML template: chats whose system prompt starts
with a timestamp miss the prefix cache on every request; lint-prompts finds it offline from the messages
(rendered and tokenized exactly as the OpenAI chat endpoint does), diagnose finds it from a live
`kiln serve --dynamo`'s metrics, and the fixed chats hit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.requests import PromptRequest

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are the support assistant of the Northwind public library. You help members find books, renew loans, "
    "book study rooms and use the e-book service. Be friendly and brief, answer in plain English, never invent "
    "opening hours or prices, and when you do not know something, say so and suggest asking at the front desk. "
    "The library has three floors: fiction on the ground floor, non-fiction and study rooms on the first floor, "
    "and the children's section with the reading garden on the second floor."
)
QUESTIONS = [
    "How do I renew a book?",
    "Can I book a study room for tomorrow?",
    "Where are the children's books?",
    "Do you have e-books?",
    "How many books can I borrow at once?",
    "Is there a quiet floor?",
    "How do I get a library card?",
    "Can I return books on Sunday?",
    "Where can I print documents?",
    "Do you lend board games?",
    "What is the reading garden?",
    "How do I reset my e-book password?",
]


def _chats(timestamped: bool) -> list[list[dict[str, str]]]:
    return [
        [
            {
                "role": "system",
                "content": (f"Current time: 2026-11-30T12:{i:02d}:{7 * i % 60:02d}Z. " if timestamped else "")
                + SYSTEM,
            },
            {"role": "user", "content": q},
        ]
        for i, q in enumerate(QUESTIONS)
    ]


def _kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def test_lint_prompts_renders_chatml_like_the_model_and_finds_the_timestamp(
    engine_factory, smollm2_hf: Path, tmp_path: Path
):
    from transformers import AutoTokenizer

    engine = engine_factory("smollm2-fp32")
    chats = _chats(timestamped=True)
    # the ids lint-prompts computes are the ids transformers' chat template gives (and the server sees)
    encoder = PromptEncoder.from_engine(EngineDir(engine))
    tok = AutoTokenizer.from_pretrained(smollm2_hf)
    for chat in chats[:3]:
        req = PromptRequest(lineno=0, data={}, messages=tuple((m["role"], m["content"]) for m in chat))
        text = encoder.render(req)
        assert text == tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert encoder.encode_requests([req], [text])[0] == tok(text, add_special_tokens=False)["input_ids"]

    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    fixed = tmp_path / "fixed.jsonl"
    r = _kiln("lint-prompts", str(path), "--engine", str(engine), "--json", "--fix", str(fixed))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["findings"] and report["findings"][0]["cause"] == "dynamic-content", report["findings"]
    assert report["baseline"]["token_hit_rate"] < 0.1
    assert report["after_request_fixes"]["token_hit_rate"] > 0.5
    r = _kiln("lint-prompts", str(fixed), "--engine", str(engine), "--min-hit-rate", "0.5")
    assert r.returncode == 0, r.stdout + r.stderr


def test_diagnose_finds_the_cache_miss_on_a_live_chatml_server(engine_factory, tmp_path: Path):
    engine = engine_factory("smollm2-fp32")
    with serve_dynamo_engine(engine, DynamoOptions(workers=1, grace_period_s=1.0)) as launcher:
        client = openai.OpenAI(base_url=launcher.url, api_key="unused", max_retries=0, timeout=120)
        for chat in _chats(timestamped=True):
            client.chat.completions.create(model="llmkiln", messages=chat, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        worker = f"{launcher.spec.status_url(0)}/metrics"
        r = _kiln("diagnose", "--metrics", worker, "--engine", str(engine), "--json")
        assert r.returncode == 0, r.stderr
        diag = json.loads(r.stdout)
        fired = [row for row in diag["rows"] if row["status"] == "yes"]
        assert any("prefill" in row["symptom"] for row in fired), diag["rows"]
        assert any("lint-prompts" in row["next_step"] for row in fired), fired
        assert diag["figures"]["hit_rate"]["value"] < 0.2, diag["figures"]["hit_rate"]
        # the same chats without the timestamp share the system prompt's blocks
        before = launcher.worker_metrics(0)
        for chat in _chats(timestamped=False):
            client.chat.completions.create(model="llmkiln", messages=chat, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        after = launcher.worker_metrics(0)
    hits = after["prefix_cache_hit_tokens_total"] - before["prefix_cache_hit_tokens_total"]
    prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    assert hits / prompt > 0.6, (hits, prompt)
