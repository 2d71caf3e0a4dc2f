"""Prefill and decode on Triton: three real tritonservers on one stories260K engine — aggregated, `--role prefill`
and `--role decode` — with real NIXL agents (UCX, DRAM) in their python-backend stubs. A client sends the prompt
to the prefill server, then the same prompt with that answer's `disaggregated_params` output to the decode
server: the decode server pulls the prompt's blocks from the prefill server's blocks and its greedy text is the
aggregated server's, through the HTTP front (generate) and gRPC streaming. A short prompt is handed back at once
and prefilled on the decode server; a hand-off that is not one is counted as a fallback and still answered right;
a hand-off sent to a model that is not a decode model is refused, naming the input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import Warmup
from llmkiln.serve.repository import spec_from_engine
from llmkiln.serve.server import TritonServer

from .client import http_generate, metric, scrape
from .conftest import engine_server

pytestmark = pytest.mark.slow
pytest.importorskip("nixl_cu12")

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. "
SHORT = "Once upon a time"
LOCAL_LIMIT = 16  # --max-local-prefill-tokens of both tiers: SHORT goes local, PROMPT * 3 moves its KV
ROLES = (WorkerRole.AGGREGATED, WorkerRole.PREFILL, WorkerRole.DECODE)


@pytest.fixture(scope="module", params=["stories-fp32", "stories-ov-fp32"])
def servers(engine_factory, request, tmp_path_factory):
    folder: Path = engine_factory(request.param)
    started: dict[WorkerRole, TritonServer] = {}
    try:
        for role in ROLES:
            tmp = tmp_path_factory.mktemp(role.value)
            kv = (
                KvTransferOptions(max_local_prefill_tokens=LOCAL_LIMIT)
                if role.moves_kv
                else KvTransferOptions()
            )
            spec = spec_from_engine(folder, role=role, kv=kv)
            spec.warmup = Warmup(count=0)
            server = engine_server(spec, tmp, http_front=True)
            server.start()
            started[role] = server
        for server in started.values():
            server.wait_ready(300)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _generate(server: TritonServer, body: dict) -> dict:
    status, out = http_generate(server.url_http, server.model, body)  # type: ignore[attr-defined]
    assert status == 200, out
    return out


def _two_hops(servers, prompt: str, max_tokens: int) -> tuple[dict, dict]:
    """The prefill server's answer, then the decode server's for the same prompt with its hand-off."""
    first = _generate(
        servers[WorkerRole.PREFILL],
        {"text_input": prompt, "max_tokens": max_tokens, "exclude_input_in_output": True},
    )
    assert isinstance(first["disaggregated_params"], str)
    second = _generate(
        servers[WorkerRole.DECODE],
        {
            "text_input": prompt,
            "max_tokens": max_tokens,
            "exclude_input_in_output": True,
            "disaggregated_params": first["disaggregated_params"],
        },
    )
    assert "disaggregated_params" not in second  # only a prefill model answers with a hand-off
    return first, second


def _metrics(server: TritonServer) -> dict[str, float]:
    return scrape(server.url_metrics)


def _settled(server: TritonServer, name: str, want: float, timeout_s: float = 10.0) -> float:
    """The metric once it reads `want`, else its last value: the model publishes a request's counters after its
    final response and the gauges every second, so a scrape right after the response may not have them yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = metric(_metrics(server), name)
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_decode_server_pulls_the_prompts_kv_and_answers_as_the_aggregated_server(servers):
    prompt = PROMPT * 3
    agg = _generate(
        servers[WorkerRole.AGGREGATED],
        {"text_input": prompt, "max_tokens": 24, "exclude_input_in_output": True},
    )
    before = _metrics(servers[WorkerRole.DECODE])
    first, second = _two_hops(servers, prompt, 24)
    handoff = json.loads(first["disaggregated_params"])
    assert handoff["kind"] == "llmkiln.kv/1" and handoff["block_ids"], handoff
    assert second["text_output"] == agg["text_output"]
    dec = servers[WorkerRole.DECODE]
    imports = metric(before, "llmkiln_kv_transfer_imports_total") + 1
    assert _settled(dec, "llmkiln_kv_transfer_imports_total", imports) == imports
    after = _metrics(dec)
    assert metric(after, "llmkiln_kv_transfer_import_blocks_total") > metric(
        before, "llmkiln_kv_transfer_import_blocks_total"
    )
    assert metric(after, "llmkiln_kv_transfer_fallbacks_total") == metric(
        before, "llmkiln_kv_transfer_fallbacks_total"
    )
    # the prefill server ran the prompt to one token, handed out one export, and released it once it was read
    prefill = servers[WorkerRole.PREFILL]
    assert _settled(prefill, "llmkiln_kv_transfer_exports_total", 1) >= 1
    assert _settled(prefill, "llmkiln_kv_transfer_exports_open", 0) == 0


def test_streamed_decode_equals_aggregated(servers):
    prompt = PROMPT * 2 + "The end. "
    agg = _generate(
        servers[WorkerRole.AGGREGATED],
        {"text_input": prompt, "max_tokens": 16, "exclude_input_in_output": True},
    )
    first = _generate(servers[WorkerRole.PREFILL], {"text_input": prompt, "max_tokens": 16})
    pieces: list[str] = []
    done: list[object] = []

    def callback(result, error):
        if error is not None:
            done.append(error)
            return
        out = result.as_numpy("text_output")
        if out is not None:
            pieces.append(out.reshape(-1)[0].decode())
        if result.get_response().parameters.get("triton_final_response").bool_param:
            done.append(True)

    client = grpcclient.InferenceServerClient(servers[WorkerRole.DECODE].url_grpc)
    try:
        client.start_stream(callback=callback)
        arrays = {
            "text_input": np.array([[prompt.encode()]], dtype=object),
            "max_tokens": np.array([[16]], dtype=np.int32),
            "stream": np.array([[True]], dtype=bool),
            "disaggregated_params": np.array([[first["disaggregated_params"].encode()]], dtype=object),
        }
        inputs = []
        for name, arr in arrays.items():
            dtype = "BYTES" if arr.dtype == object else ("BOOL" if arr.dtype == bool else "INT32")
            inp = grpcclient.InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        client.async_stream_infer(
            servers[WorkerRole.DECODE].model,  # type: ignore[attr-defined]
            inputs,
            request_id="roles-1",
            enable_empty_final_response=True,
        )
        deadline = time.monotonic() + 60
        while not done and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.stop_stream()
        client.close()
    assert done == [True], done
    assert "".join(pieces) == agg["text_output"]


def test_a_short_prompt_is_handed_back_and_prefilled_on_the_decode_server(servers):
    agg = _generate(
        servers[WorkerRole.AGGREGATED],
        {"text_input": SHORT, "max_tokens": 12, "exclude_input_in_output": True},
    )
    pre, dec = servers[WorkerRole.PREFILL], servers[WorkerRole.DECODE]
    handed = metric(_metrics(pre), "llmkiln_kv_transfer_local_handoffs_total")
    local = metric(_metrics(dec), "llmkiln_kv_transfer_local_prefills_total")
    first, second = _two_hops(servers, SHORT, 12)
    assert json.loads(first["disaggregated_params"])["kind"] == "llmkiln.local/1"
    assert first["text_output"] == ""  # the prefill engine was not involved
    assert second["text_output"] == agg["text_output"]
    assert _settled(pre, "llmkiln_kv_transfer_local_handoffs_total", handed + 1) == handed + 1
    assert _settled(dec, "llmkiln_kv_transfer_local_prefills_total", local + 1) == local + 1


def test_a_hand_off_that_is_not_one_falls_back_and_is_still_right(servers):
    prompt = PROMPT + "Lily and her dog ran home. "
    agg = _generate(
        servers[WorkerRole.AGGREGATED],
        {"text_input": prompt, "max_tokens": 12, "exclude_input_in_output": True},
    )
    dec = servers[WorkerRole.DECODE]
    fallbacks = metric(_metrics(dec), "llmkiln_kv_transfer_fallbacks_total")
    for bad in ("not json", json.dumps({"kind": "somebody.else/1"})):
        out = _generate(
            dec,
            {
                "text_input": prompt,
                "max_tokens": 12,
                "exclude_input_in_output": True,
                "disaggregated_params": bad,
            },
        )
        assert out["text_output"] == agg["text_output"]
    assert _settled(dec, "llmkiln_kv_transfer_fallbacks_total", fallbacks + 2) == fallbacks + 2


@pytest.mark.parametrize("role", [WorkerRole.AGGREGATED, WorkerRole.PREFILL])
def test_a_hand_off_sent_to_a_model_that_is_not_a_decode_model_is_refused(servers, role):
    server = servers[role]
    status, out = http_generate(
        server.url_http,
        server.model,  # type: ignore[attr-defined]
        {"text_input": PROMPT, "max_tokens": 4, "disaggregated_params": "{}"},
    )
    assert status == 400, out
    assert "input 'disaggregated_params' is the hand-off a decode-role model takes" in out["error"]
    assert f"this model is {role.value}" in out["error"]


def test_kiln_serve_refuses_kv_flags_without_a_role_and_role_with_dynamo(engine_factory):
    folder = engine_factory("stories-fp32")
    for args, message in (
        (["--kv-export-timeout", "5"], "give --role prefill or decode"),
        (["--role", "prefill", "--dynamo"], "--role: Triton's flag"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "llmkiln.cli.main", "serve", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stderr
        assert message in r.stderr, r.stderr
