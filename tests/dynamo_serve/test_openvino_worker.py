"""The openvino-cpu engine as a Dynamo worker: the OpenAI endpoint serves it with the same greedy tokens as the
onnxruntime engine of the same weights, and reports a repeated system prompt's prefix as cached."""

from __future__ import annotations

import pytest

from .conftest import MODEL, client

pytestmark = pytest.mark.slow

SYSTEM = "You are a storyteller for small children. Keep every story short, kind and simple. " * 4


@pytest.fixture(scope="module")
def ov_cluster(launch, engine_factory):
    return launch(engine_factory("stories-ov-fp32"), workers=1)


@pytest.fixture(scope="module")
def ort_cluster(launch, stories_engine):
    return launch(stories_engine, workers=1)


def _complete(cluster, prompt: str) -> str:
    r = client(cluster).completions.create(model=MODEL, prompt=prompt, max_tokens=16)
    assert r.usage.completion_tokens == 16
    return str(r.choices[0].text)


def test_openvino_worker_answers_like_the_onnxruntime_worker(ov_cluster, ort_cluster):
    for prompt in ("Once upon a time", "The little dog ran to the park and", SYSTEM + "User: A cat?\n"):
        assert _complete(ov_cluster, prompt) == _complete(ort_cluster, prompt)


def test_openvino_worker_reports_cached_tokens(ov_cluster):
    c = client(ov_cluster)
    usages = []
    for question in ("What does the dog do?", "Where does the bird live?"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        usages.append(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=4).usage)
    block = 16
    assert usages[1].prompt_tokens_details.cached_tokens >= (usages[0].prompt_tokens // block - 2) * block > 0
