"""Warmup that primes what it claims: each warmup.prefixes entry must fill one KV block (checked at build time
with the engine's tokenizer), and the prefixes are sent before READY (first) by the CPU repository too."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmkiln.backends import build as build_engine
from llmkiln.build.progress import QuietProgress
from llmkiln.build.warmup_check import prefix_problems
from llmkiln.errors import BadInput
from llmkiln.recipe import Warmup, load_recipe
from llmkiln.serve.repository import RepoSpec, build_model_config

SYSTEM = "You are a helpful assistant. Answer briefly and accurately, and say so when you do not know.\n"


def test_the_rule_on_token_counts() -> None:
    r, _ = load_recipe("tiny-fp32", overrides={"warmup": {"prefixes": ["short", SYSTEM], "prompts": ["hi"]}})
    block = r.kv_cache.tokens_per_block
    problems = prefix_problems(r, [block - 1, block], [3], limit=100)
    assert len(problems) == 1 and problems[0].startswith(f"warmup.prefixes[0] is {block - 1} tokens, shorter")
    assert prefix_problems(r, [block, block], [101], limit=100) == [
        "warmup.prompts[0] is 101 tokens, over the prompt limit 100: 'hi'"
    ]


def test_every_backend_takes_its_warmup_texts_from_one_place() -> None:
    r, _ = load_recipe(
        "tiny-fp32", overrides={"warmup": {"prefixes": [SYSTEM], "prompts": ["hi"], "count": 2}}
    )
    assert r.warmup.texts() == [SYSTEM, "hi"] and r.warmup.num_requests() == 4
    cfg = build_model_config(RepoSpec("llmkiln", Path("/srv/engine"), warmup=r.warmup))
    assert not cfg.model_warmup  # the CPU model's engine host runs the warmup in initialize()
    assert Warmup.model_validate_json(cfg.parameters["warmup"].string_value) == r.warmup
    none, _ = load_recipe("tiny-fp32", overrides={"warmup": {"prefixes": [SYSTEM], "count": 0}})
    assert none.warmup.texts() == [] and none.warmup.num_requests() == 0


class _Engine:
    """Records what the host's warmup submits."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def submit(self, prompt, params=None, priority=0, request_id=None):
        from llmkiln.runtime.handle import RequestHandle
        from llmkiln.runtime.request import Request, TokenEvent

        self.sent.append(prompt)
        h = RequestHandle(Request(str(len(self.sent)), [1], params), lambda rid: None)
        h._push(TokenEvent(2, 0, True, "length"))
        return h


def test_the_host_warmup_sends_prefixes_first_count_times() -> None:
    from llmkiln.host.warmup import run_warmup

    r, _ = load_recipe(
        "tiny-fp32", overrides={"warmup": {"prefixes": [SYSTEM], "prompts": ["hi"], "count": 2}}
    )
    eng = _Engine()
    result = run_warmup(eng, r.warmup)
    assert eng.sent == [SYSTEM, SYSTEM, "hi", "hi"] and result.requests == 4


def test_a_prefix_shorter_than_one_block_fails_the_cpu_build(
    session_engines_root: Path, tmp_path: Path
) -> None:
    recipe = tmp_path / "tiny-short-prefix.yaml"
    recipe.write_text('name: tiny-short-prefix\nextends: tiny-fp32\nwarmup:\n  prefixes: ["Hi there"]\n')
    with pytest.raises(BadInput, match=r"warmup.prefixes\[0\] is \d+ tokens, shorter than one KV block"):
        build_engine(recipe, session_engines_root, progress=QuietProgress())
    assert not (session_engines_root / "tiny-short-prefix").exists()
    good = tmp_path / "tiny-long-prefix.yaml"
    good.write_text(f"name: tiny-long-prefix\nextends: tiny-fp32\nwarmup:\n  prefixes: [{SYSTEM!r}]\n")
    done = build_engine(good, session_engines_root, progress=QuietProgress())
    assert done.manifest["warmup-check"]["prefix_tokens"][0] >= 16
