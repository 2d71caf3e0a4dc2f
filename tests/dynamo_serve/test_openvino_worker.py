"""The openvino-cpu engine as a Dynamo worker: the OpenAI endpoint serves it with the same greedy tokens as the
onnxruntime engine of the same weights, reports a repeated system prompt's prefix as cached, and with a step
profile on writes each request's way through the worker beside the engine's record of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .conftest import MODEL, client

pytestmark = pytest.mark.slow

SYSTEM = "You are a storyteller for small children. Keep every story short, kind and simple. " * 4


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("profile")


@pytest.fixture(scope="module")
def ov_cluster(launch, engine_factory, profile_dir):
    return launch(engine_factory("stories-ov-fp32"), workers=1, profile_dir=profile_dir)


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


def _records(path: Path, kind: str) -> dict[str, dict]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return {r["id"]: r for r in map(json.loads, lines) if r.get("kind") == kind}


def test_a_profiled_worker_records_each_requests_way_through_it(ov_cluster, profile_dir):
    """$LLMKILN_PROFILE (DynamoOptions.profile_dir): the worker's serve record — Dynamo handed the request over,
    the engine took it, its first token reached the worker's loop and went to Dynamo — under the engine's request
    id, whose request record (arrival, first scheduled, first token) falls between them."""
    before = time.time_ns()
    stream = client(ov_cluster).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=4, stream=True
    )
    assert sum(1 for _ in stream) >= 4
    path = profile_dir / "worker-0.jsonl"
    deadline = time.monotonic() + 30
    while True:  # the engine writes its request record once the request is done
        serves, requests = _records(path, "serve"), _records(path, "request")
        mine = [s for s in serves.values() if s["received"] >= before and s["id"] in requests]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(mine) == 1, (serves, requests)
    s, e = mine[0], requests[mine[0]["id"]]
    assert s["tokens"] == 4
    assert s["received"] <= e["arrival"] <= s["submit"]  # the engine stamps arrival inside submit
    assert (
        e["arrival"] <= e["scheduled"] <= e["first_token"] <= s["first_seen"] <= s["first_sent"] <= s["done"]
    )
