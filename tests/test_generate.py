"""`kiln generate` and the pieces behind it: greedy ids equal HF generate, sampling, incremental detokenizing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmkiln.errors import BadInput
from llmkiln.runtime.detokenizer import IncrementalDetokenizer
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.sampling import make_rng, sample_token


@pytest.fixture(scope="module")
def fp32(engine_factory):
    from llmkiln.runtime.simple import SimpleGenerator

    return SimpleGenerator(engine_factory("stories-fp32"))


@pytest.mark.slow
def test_greedy_64_tokens_equal_hf_generate(fp32, stories_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(stories_dir, dtype=torch.float32).eval()
    ids = fp32.encode("Once upon a time")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)[0, len(ids) :].tolist()
    ours = list(fp32.generate(ids, 64))
    assert len(ref) == 64
    assert ours == ref


@pytest.mark.slow
def test_cli_streams_the_greedy_text(fp32, engine_factory) -> None:
    engine = engine_factory("stories-fp32")
    argv = [
        sys.executable,
        "-m",
        "llmkiln.cli.main",
        "generate",
        str(engine),
        "Once upon a time",
        "--max-tokens",
        "64",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    expected = fp32.decode(list(fp32.generate(fp32.encode("Once upon a time"), 64)))
    assert out == expected + "\n"
    assert out.startswith(",")  # "Once upon a time" → ", there was ..."


@pytest.mark.slow
def test_cli_sampling_is_seeded(engine_factory) -> None:
    engine = engine_factory("stories-fp32")
    base = [sys.executable, "-m", "llmkiln.cli.main", "generate", str(engine), "Once upon a time"]
    opts = ["--max-tokens", "40", "--temperature", "1.0", "--top-p", "0.95", "--top-k", "50"]

    def run(seed: int) -> str:
        return subprocess.run(
            [*base, *opts, "--seed", str(seed)], capture_output=True, text=True, check=True
        ).stdout

    a, b = run(1), run(1)
    assert a == b and a.strip()
    assert any(run(s) != a for s in (2, 3, 4))


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "llmkiln.cli.main", "generate", str(tmp_path / "nope"), "hi"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_greedy_is_argmax_and_top_k_1() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0])
    assert sample_token(logits) == 1
    assert sample_token(logits, temperature=5.0, top_k=1, rng=make_rng(0)) == 1


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = make_rng(0)
    top_k = {sample_token(logits, temperature=1.0, top_k=2, rng=rng) for _ in range(300)}
    assert top_k == {0, 1}
    top_p = {sample_token(logits, temperature=1.0, top_p=0.8, rng=rng) for _ in range(300)}
    assert top_p == {0, 1}  # 0.5 + 0.3 reaches 0.8
    everything = {sample_token(logits, temperature=1.0, rng=rng) for _ in range(600)}
    assert everything == {0, 1, 2, 3}


def test_sampling_follows_the_distribution_and_the_seed() -> None:
    logits = np.log(np.array([0.7, 0.2, 0.1]))
    draws = [sample_token(logits, temperature=1.0, rng=make_rng(7)) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same first draw
    rng = make_rng(0)
    counts = np.bincount([sample_token(logits, temperature=1.0, rng=rng) for _ in range(4000)], minlength=3)
    np.testing.assert_allclose(counts / 4000, [0.7, 0.2, 0.1], atol=0.03)


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}, {"temperature": float("nan")}],
)
def test_bad_sampling_settings_are_bad_input(kwargs: dict) -> None:
    with pytest.raises(BadInput):
        SamplingParams(**kwargs)


def test_detokenizer_never_splits_a_character(stories_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(stories_dir / "tokenizer.json"))
    text = "Once upon a time, Zoë saw 日本 and a 🐶 café."
    ids = tok.encode(text).ids
    prompt, rest = ids[:3], ids[3:]
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.push(t) for t in rest]
    pieces.append(detok.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert tok.decode(prompt) + "".join(pieces) == tok.decode(ids)
    assert sum(1 for p in pieces if p == "") > 3  # multi-byte characters arrived over several byte tokens
