"""The real chat model end to end: every front door's greedy reply equals transformers' greedy `generate` on
the same checkpoint, token for token in text — through the OpenAI endpoint (`kiln serve --dynamo`: chat and
completions, streaming and not) and through Triton (gRPC streaming and HTTP generate), on the onnxruntime and
the OpenVINO fp32 engines. (bf16/int8 engines are compared by the quality diff instead: tests/realmodel/
test_quality.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmkiln.bench.serving import serve_dynamo_engine, serve_engine
from llmkiln.dynamo.launcher import DynamoLauncher
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from tests.realmodel.conftest import CHATS, MAX_TOKENS, Reference
from tests.serve.client import http_generate, stream_many

pytestmark = pytest.mark.slow

ENGINES = ["smollm2-fp32", "smollm2-ov-fp32"]
MODEL = "llmkiln"


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest, engine_factory) -> Path:
    return engine_factory(request.param)


def test_the_engine_carries_the_models_chat_template_and_end_tokens(engine: Path, smollm2_hf: Path):
    folder = EngineDir(engine)
    own = (smollm2_hf / "chat_template.jinja").read_text()
    assert folder.chat_template() == own
    assert (engine / "chat_template.jinja").read_text() == own
    assert folder.tokenizer_config()["eos_token"] == "<|im_end|>"
    assert 2 in folder.stop_token_ids()  # <|im_end|>
    manifest = folder.require_manifest()
    assert manifest.source.package is not None
    assert manifest.source.package["gguf_sha256"] == (
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    )
    assert manifest.part("tokenizer")["chat_template"] == "model (chat_template.jinja)"


@pytest.fixture(scope="module")
def dynamo(engine: Path) -> Iterator[DynamoLauncher]:
    with serve_dynamo_engine(engine, DynamoOptions(workers=1, grace_period_s=1.0)) as launcher:
        yield launcher


def _client(launcher: DynamoLauncher) -> openai.OpenAI:
    return openai.OpenAI(base_url=launcher.url, api_key="unused", max_retries=0, timeout=120)


def _finish(ref: Reference) -> str:
    return "stop" if ref.finished else "length"


def test_openai_chat_equals_transformers(dynamo: DynamoLauncher, references: list[Reference]):
    client = _client(dynamo)
    for chat, ref in zip(CHATS, references, strict=True):
        r = client.chat.completions.create(
            model=MODEL,
            messages=chat,
            max_tokens=MAX_TOKENS,
            temperature=0,  # type: ignore[arg-type]
        )
        assert r.choices[0].message.content == ref.text, chat
        assert r.choices[0].finish_reason == _finish(ref)
        assert r.usage is not None and r.usage.prompt_tokens == len(ref.prompt_ids), chat
        assert "<|im_end|>" not in (r.choices[0].message.content or "")


def test_openai_chat_stream_equals_transformers(dynamo: DynamoLauncher, references: list[Reference]):
    client = _client(dynamo)
    for chat, ref in zip(CHATS, references, strict=True):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=chat,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        pieces, finish = [], None
        with stream:
            for chunk in stream:
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
        assert "".join(pieces) == ref.text, chat
        assert finish == _finish(ref)


def test_openai_completions_equal_transformers(dynamo: DynamoLauncher, references: list[Reference]):
    # the prompt text the chat template renders, sent as a completion: the same ids, the same reply
    client = _client(dynamo)
    for ref in references:
        r = client.completions.create(
            model=MODEL, prompt=ref.prompt_text, max_tokens=MAX_TOKENS, temperature=0
        )
        assert r.choices[0].text == ref.text, ref.prompt_text
        assert r.usage is not None and r.usage.prompt_tokens == len(ref.prompt_ids)
        stream = client.completions.create(
            model=MODEL, prompt=ref.prompt_text, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        with stream:
            text = "".join(c.choices[0].text for c in stream if c.choices)
        assert text == ref.text, ref.prompt_text


def test_triton_equals_transformers(engine: Path, references: list[Reference]):
    with serve_engine(engine) as served:
        streamed = stream_many(
            served.url,
            served.model,
            [
                {"prompt": ref.prompt_text, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True}
                for ref in references
            ],
        )
        for ref, got in zip(references, streamed, strict=True):
            assert got.error is None, got.error
            assert got.text == ref.text, ref.prompt_text
        for ref in references[:3]:
            status, body = http_generate(
                served.server.url_http,
                served.model,
                {"text_input": ref.prompt_text, "max_tokens": MAX_TOKENS, "exclude_input_in_output": True},
            )
            assert status == 200, json.dumps(body)[:300]
            assert body["text_output"] == ref.text
