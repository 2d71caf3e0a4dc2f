"""Acceptance: the real CPU runtime on the real stories260K engines (onnxruntime and OpenVINO runners), served by
the real tritonserver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmkiln.cpu_features import detect
from llmkiln.recipe import Warmup
from llmkiln.serve.repository import spec_from_engine
from llmkiln.serve.server import TritonServer

from .client import http_generate, metric, scrape, stream_many
from .conftest import engine_server

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a friendly storyteller. You tell short, happy stories about animals, children and their toys. "
    "Every story has a beginning, a middle and an end.\n"
)
WARMUP = Warmup(prompts=[SYSTEM, "Once upon a time"], count=2, max_tokens=4)


@pytest.fixture(scope="module", params=["stories-fp32", "stories-ov-fp32"])
def engine(engine_factory, request) -> Path:
    return engine_factory(request.param)


@pytest.fixture(scope="module")
def served(engine: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("serve")
    spec = spec_from_engine(engine)
    spec.warmup = WARMUP  # the recipe's warmup section, with a shared system prompt to prime the prefix cache
    server = engine_server(spec, tmp, workdir=tmp)
    server.start()
    server.wait_ready(300)
    yield server
    server.stop()


def test_warmup_runs_before_ready(served: TritonServer):
    # The engine host runs the warmup inside the model's initialize(), which Triton waits for before the model
    # is loaded (READY): the order is by construction, the log and the counters show it ran.
    assert any("llmkiln: warmup done: 4 requests in" in ln for ln in served.lines)
    values = scrape(served.url_metrics)
    assert metric(values, "llmkiln_warmup_requests_total") == 4
    assert metric(values, "llmkiln_warmup_seconds") > 0


def _kiln_generate(engine: Path, prompt: str, max_tokens: int) -> str:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmkiln.cli.main",
            "generate",
            str(engine),
            prompt,
            "--max-tokens",
            str(max_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.removesuffix("\n")


def test_streaming_grpc_matches_kiln_generate(served: TritonServer, engine: Path):
    prompt = "Once upon a time, there was a little dog"
    [r] = stream_many(served.url_grpc, served.model, [{"prompt": prompt, "max_tokens": 40, "stream": True}])
    assert r.error is None and len(r.pieces) > 1  # streamed in pieces
    assert r.text == _kiln_generate(engine, prompt, 40)


def test_non_streaming_http_generate(served: TritonServer):
    prompt = "Lily wanted to play"
    status, body = http_generate(served.url_http, served.model, {"text_input": prompt, "max_tokens": 12})
    assert status == 200, body
    assert body["text_output"].startswith(prompt) and len(body["text_output"]) > len(prompt)
    status, only = http_generate(
        served.url_http,
        served.model,
        {"text_input": prompt, "max_tokens": 12, "exclude_input_in_output": True},
    )
    assert status == 200 and prompt + only["text_output"] == body["text_output"]
    [r] = stream_many(served.url_grpc, served.model, [{"prompt": prompt, "max_tokens": 12, "stream": True}])
    assert r.text == only["text_output"]


def test_warmup_primed_the_prefix_cache(served: TritonServer):
    [r] = stream_many(
        served.url_grpc,
        served.model,
        [{"prompt": SYSTEM + "Tell me about a cat.", "max_tokens": 4, "return_perf_metrics": True}],
    )
    assert r.error is None
    reused = int(r.final.as_numpy("kv_cache_reused_tokens")[0, 0])
    assert reused >= 16, "the shared system prompt should come from the prefix cache filled by warmup"
    arrival = int(r.final.as_numpy("arrival_time_ns")[0, 0])
    assert (
        int(r.final.as_numpy("first_token_time_ns")[0, 0])
        >= int(r.final.as_numpy("first_scheduled_time_ns")[0, 0])
        >= arrival
        > 0
    )


def test_sixteen_concurrent_streams_all_complete(served: TritonServer):
    prompts = [f"Once upon a time, a {animal}" for animal in ("cat", "dog", "bird", "fish")] * 4
    results = stream_many(
        served.url_grpc,
        served.model,
        [{"prompt": p, "max_tokens": 24, "stream": True} for p in prompts],
        timeout_s=300,
    )
    assert all(r.error is None and r.final is not None for r in results)
    assert all(r.text for r in results)
    for i in range(4):  # greedy: the same prompt gives the same text whatever else is batched with it
        assert {r.text for r in results[i::4]} == {results[i].text}


def test_bad_requests_get_clear_errors(served: TritonServer):
    results = stream_many(
        served.url_grpc,
        served.model,
        [
            {"prompt": "x", "max_tokens": 0},
            {"prompt": "The dog " * 400, "max_tokens": 4},
            {"prompt": "x", "max_tokens": 4, "top_p": np.array([[1.5]], dtype=np.float32)},
        ],
    )
    errors = sorted(r.error or "" for r in results)
    assert any("max_tokens" in e and ">= 1" in e for e in errors), errors
    assert any("request rejected" in e and "prompt" in e for e in errors), errors
    assert any("top_p" in e for e in errors), errors
    # a wrong input type is refused by Triton itself, naming the input and both types
    [r] = stream_many(
        served.url_grpc,
        served.model,
        [{"prompt": "x", "max_tokens": 4, "temperature": np.array([[1]], dtype=np.int64)}],
    )
    assert r.error is not None and "'temperature'" in r.error and "expects 'FP32'" in r.error, r.error
    status, body = http_generate(served.url_http, served.model, {"max_tokens": 4})
    assert status >= 400 and "text_input" in body.get("error", ""), body


def test_metrics_endpoint_shows_custom_metrics(served: TritonServer):
    values = scrape(served.url_metrics)
    for name in (
        "llmkiln_prefix_cache_hit_rate",
        "llmkiln_prefix_cache_hit_tokens_total",
        "llmkiln_kv_blocks_used",
        "llmkiln_queue_length",
        "llmkiln_ttft_ms_count",
        "llmkiln_ttft_ms_bucket",
        'llmkiln_engine{metric="mean_queue_time_ms"',
    ):
        assert any(k.startswith(name) for k in values), name
    assert metric(values, "llmkiln_ttft_ms_count") >= 20
    assert metric(values, "llmkiln_prefix_cache_hit_tokens_total") >= 16
    assert 0 < metric(values, "llmkiln_prefix_cache_hit_rate") <= 1
    assert metric(values, "llmkiln_requests_rejected_total") >= 3
    # the CPU it runs on and the runner's settings, as info gauges (1 each)
    cpu = detect()
    [features] = [k for k in values if k.startswith("llmkiln_cpu_features{")]
    assert f'kind="{cpu.kind}"' in features and 'model="llmkiln"' in features and values[features] == 1
    assert any(k.startswith("llmkiln_runtime_setting{") and 'name="precision"' in k for k in values), values


def test_overload_is_refused_with_queue_full(engine: Path, tmp_path: Path):
    # a server of its own whose runtime runs one sequence and queues one more (engine_overrides)
    spec = spec_from_engine(engine)
    spec.engine_overrides = {"scheduler": {"max_batch_size": 1, "max_queue_size": 1}}
    server = engine_server(spec, tmp_path, workdir=tmp_path)
    server.start()
    try:
        server.wait_ready(300)
        results = stream_many(
            server.url_grpc,
            spec.model_name,
            [{"prompt": f"Once upon a time {i}", "max_tokens": 100} for i in range(8)],
        )
    finally:
        server.stop()
    errors = [r.error for r in results if r.error]
    assert errors and all("queue full" in e and "max_queue_size = 1" in e for e in errors), errors
    assert len(errors) < 8 and all(r.final is not None for r in results if not r.error)
    assert server.leftover_processes() == [] and server.leftover_shm() == []


def test_sigterm_leaves_no_process_and_no_shm_file(served: TritonServer):
    assert served.leftover_processes() and served.leftover_shm()
    assert served.stop() == 0, served.last_lines()
    assert not served.forced_exit
    assert served.leftover_processes() == []
    assert served.leftover_shm() == []
