"""Speculative decoding on the real model (SmolLM2-135M-Instruct, OpenVINO fp32): n-gram drafts change no token.

Greedy replies with speculation equal transformers' greedy `generate` (the references of the chat test) and the
runtime's own replies without it, in-process and through Triton (where a request may also turn it off); on a
reply that repeats its prompt most drafts are accepted. fp32 only: in bf16 the verification's batched rows round
differently from one-row decode steps, so a near-tie may flip (measured in bench/results/spec-decode)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmkiln.bench.serving import serve_engine
from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import SamplingParams
from tests.realmodel.conftest import MAX_TOKENS, Reference
from tests.serve.client import scrape, stream_many

pytestmark = pytest.mark.slow

NGRAM = {"speculative": {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3}}
TEXT = (
    "Lightning is a giant spark of electricity that forms inside storm clouds. In a thundercloud, strong "
    "updrafts carry water droplets and ice crystals upward, where they collide with falling pellets of soft hail."
)
GROUNDED = [
    f"Rewrite the following text exactly as it is:\n\n{TEXT}",
    f"Repeat this paragraph, word for word:\n\n{TEXT}",
]


@pytest.fixture(scope="module")
def engine(engine_factory) -> Path:
    return engine_factory("smollm2-ov-fp32")


def _grounded_ids(engine: Path, eng) -> list[list[int]]:
    template = EngineDir(engine).chat_template()
    assert template is not None
    return [eng.encode(render(template, [{"role": "user", "content": q}])) for q in GROUNDED]


def test_speculative_greedy_replies_equal_plain_ones_token_for_token(
    engine: Path, references: list[Reference]
):
    params = SamplingParams(max_tokens=MAX_TOKENS)
    long = SamplingParams(max_tokens=96)
    with load_engine(EngineDir(engine)) as plain:
        grounded = _grounded_ids(engine, plain)
        plain_grounded = [plain.generate([ids], long)[0] for ids in grounded]
    with load_engine(EngineDir(engine), NGRAM) as spec:
        for ref in references:
            assert spec.generate([ref.prompt_ids], params)[0] == ref.reply_ids, ref.prompt_text
        before = spec.metrics()
        for ids, want in zip(grounded, plain_grounded, strict=True):
            assert spec.generate([ids], long)[0] == want
        after = spec.metrics()
    drafted = after["spec_drafted_tokens"] - before["spec_drafted_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert drafted > 0 and accepted / drafted >= 0.5, (accepted, drafted)  # the reply repeats the prompt
    # verifications happened and emitted 1 + accepted tokens each
    assert after["spec_verifications"] > 0 and after["spec_mean_accepted_length"] > 0.5


def test_drafts_from_earlier_replies_change_no_token(engine: Path, references: list[Reference]):
    """speculative.history_tokens: a lone sequence whose own text matches nothing drafts from the replies before
    it (runtime.draft_history); every reply still equals transformers' greedy one."""
    history = {"speculative": NGRAM["speculative"] | {"history_tokens": 4096}}
    params = SamplingParams(max_tokens=MAX_TOKENS)
    with load_engine(EngineDir(engine), history) as spec:
        for ref in references:
            assert spec.generate([ref.prompt_ids], params)[0] == ref.reply_ids, ref.prompt_text
        m = spec.metrics()
    assert m["spec_history_drafted_tokens"] > 0 and m["spec_history_accepted_tokens"] > 0, m


def test_triton_serves_speculative_replies_equal_to_transformers(engine: Path, references: list[Reference]):
    refs = references[:4]
    off = {"num_speculative_tokens": np.array([[0]], dtype=np.int32)}
    history = {"speculative": NGRAM["speculative"] | {"history_tokens": 4096}}
    with serve_engine(engine, overrides=history) as served:
        requests = [
            {"prompt": ref.prompt_text, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True}
            for ref in refs
        ]
        streamed = stream_many(served.url, served.model, requests + [r | off for r in requests])
        for ref, got in zip(refs + refs, streamed, strict=True):
            assert got.error is None, got.error
            assert got.text == ref.text, ref.prompt_text
        values = scrape(served.server.url_metrics)
    drafted = [
        v
        for k, v in values.items()
        if k.startswith("llmkiln_engine{") and 'metric="spec_drafted_tokens"' in k
    ]
    assert drafted and drafted[0] > 0, "the engine's drafted tokens on /metrics"
    # the history's own counters are there too (drafts from earlier replies where a lone sequence decodes)
    assert any('metric="spec_history_drafted_tokens"' in k for k in values), sorted(values)[:20]
