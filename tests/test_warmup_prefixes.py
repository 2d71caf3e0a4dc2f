"""Warmup that primes what it claims: each warmup.prefixes entry must fill one KV block (checked at build time
with the engine's tokenizer), and the prefixes are sent before READY (first) by the CPU repository too."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llmkiln.backends import build as build_engine
from llmkiln.build.progress import QuietProgress
from llmkiln.build.warmup_check import prefix_problems
from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe
from llmkiln.serve.repository import RepoSpec, build_model_config, warmup_files, warmup_request_count

SYSTEM = "You are a helpful assistant. Answer briefly and accurately, and say so when you do not know.\n"


def test_the_rule_on_token_counts() -> None:
    r, _ = load_recipe("tiny-fp32", overrides={"warmup": {"prefixes": ["short", SYSTEM], "prompts": ["hi"]}})
    block = r.kv_cache.tokens_per_block
    problems = prefix_problems(r, [block - 1, block], [3], limit=100)
    assert len(problems) == 1 and problems[0].startswith(f"warmup.prefixes[0] is {block - 1} tokens, shorter")
    assert prefix_problems(r, [block, block], [101], limit=100) == [
        "warmup.prompts[0] is 101 tokens, over the prompt limit 100: 'hi'"
    ]


def test_cpu_repository_sends_the_prefixes_first() -> None:
    r, _ = load_recipe(
        "tiny-fp32", overrides={"warmup": {"prefixes": [SYSTEM], "prompts": ["hi"], "count": 2}}
    )
    spec = RepoSpec("llmkiln", Path("/srv/engine"), warmup=r.warmup)
    cfg = build_model_config(spec)
    assert [w.inputs["text_input"].input_data_file for w in cfg.model_warmup] == [
        "text_input_0",
        "text_input_1",
    ]
    assert warmup_request_count(r.warmup) == 4 and cfg.parameters["warmup_requests"].string_value == "4"
    raw = warmup_files(spec)["text_input_0"]
    assert struct.unpack("<I", raw[:4])[0] == len(SYSTEM.encode()) and raw[4:].decode() == SYSTEM


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
