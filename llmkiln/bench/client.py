"""Async streaming gRPC client (tritonclient.grpc.aio) that replays a workload at a bounded concurrency.

Each request is one decoupled stream: text_input/max_tokens/stream=True (plus the optional tensorrtllm_backend
inputs the model declares, greedy, with return_perf_metrics). Every response with non-empty `text_output` is a
token arrival (the model streams one response per text delta); the final response is flagged by Triton's
`triton_final_response` parameter, which the client asks for. Integer perf outputs the server returns
(first-token time, reused KV tokens, output token count, ...) are kept per request. The client talks to loopback addresses only and stops by itself: a per-request timeout turns a hung
stream into an error instead of a hang.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import BenchRequest
from llmkiln.errors import BadInput, KilnError

# Output names whose value is the number of prompt tokens served from the prefix cache.
CACHED_TOKEN_OUTPUTS = ("kv_cache_reused_tokens", "num_cached_tokens", "cached_tokens")
# Output name of the server's count of generated tokens (the final response's perf fields).
OUTPUT_TOKEN_OUTPUTS = ("num_output_tokens",)


def check_loopback(url: str) -> tuple[str, int]:
    """'127.0.0.1:8001' -> (host, port). Only loopback hosts are allowed (a benchmark must not leave the machine)."""
    host, sep, port_s = url.rpartition(":")
    if not sep or not port_s.isdigit() or not host:
        raise BadInput(f"--url {url!r}: expected HOST:PORT, e.g. 127.0.0.1:8001")
    port = int(port_s)
    if not 0 < port < 65536:
        raise BadInput(f"--url {url!r}: port {port} is out of range")
    h = host.strip("[]")
    if h != "localhost":
        try:
            loop = ipaddress.ip_address(h).is_loopback
        except ValueError:
            loop = False
        if not loop:
            raise BadInput(f"--url {url!r}: only loopback hosts (127.0.0.1, ::1, localhost) are benchmarked")
    return host, port


@dataclass(frozen=True)
class ModelIO:
    """What the served model declares: its batch dimension and input names/dtypes."""

    max_batch_size: int
    inputs: dict[str, tuple[str, list[int]]]  # name -> (triton dtype, dims)
    outputs: tuple[str, ...]
    decoupled: bool


async def fetch_model_io(client: grpcclient.InferenceServerClient, model: str) -> ModelIO:
    """Read the model's config from the server; raises KilnError when it is not served."""
    try:
        cfg = (await client.get_model_config(model, as_json=True))["config"]
    except InferenceServerException as exc:
        raise KilnError(f"model {model!r} is not available on the server: {exc.message()}") from None
    inputs = {
        i["name"]: (i["data_type"].removeprefix("TYPE_"), [int(d) for d in i.get("dims", [])])
        for i in cfg["input"]
    }
    outputs = tuple(o["name"] for o in cfg.get("output", []))
    decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
    if "text_input" not in inputs or "max_tokens" not in inputs or "text_output" not in outputs:
        raise KilnError(
            f"model {model!r} does not follow the tensorrtllm_backend I/O (text_input, max_tokens -> text_output)"
        )
    return ModelIO(int(cfg.get("max_batch_size", 0)), inputs, outputs, decoupled)


_NP = {
    "BYTES": np.object_,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
    "FP32": np.float32,
    "UINT64": np.uint64,
}


def _tensor(io: ModelIO, name: str, value: object) -> grpcclient.InferInput:
    dtype, dims = io.inputs[name]
    shape = [1 if d < 0 else d for d in dims] or [1]
    if io.max_batch_size > 0:
        shape = [1, *shape]
    arr = np.full(shape, value, dtype=_NP.get(dtype, np.object_))
    if dtype in ("STRING", "BYTES"):
        arr = np.array([str(value).encode("utf-8")] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
    t = grpcclient.InferInput(
        name, shape, "BYTES" if arr.dtype == np.object_ else np_to_triton_dtype(arr.dtype)
    )
    t.set_data_from_numpy(arr)
    return t


def grpc_inputs(prompt: str, max_tokens: int, **extra: object) -> list[grpcclient.InferInput]:
    """Request tensors [1, 1] for a model with tensorrtllm_backend-style inputs, without asking it for its
    config: text_input, max_tokens (INT32), and each `extra` input (a scalar, or an array as given)."""
    arrays: dict[str, np.ndarray] = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
    }
    for name, value in extra.items():
        arrays[name] = value if isinstance(value, np.ndarray) else np.array([[value]])
    out = []
    for name, arr in arrays.items():
        dtype = "BYTES" if arr.dtype == np.object_ else np_to_triton_dtype(arr.dtype)
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def build_inputs(io: ModelIO, req: BenchRequest, seed: int | None = None) -> list[grpcclient.InferInput]:
    """Greedy streaming request tensors for `req` (optional inputs only when the model declares them)."""
    values: dict[str, object] = {"text_input": req.prompt, "max_tokens": req.max_tokens}
    optional = {
        "stream": True,
        "exclude_input_in_output": True,
        "temperature": 0.0,
        "top_k": 1,
        "return_perf_metrics": True,
    }
    if seed is not None:
        optional["random_seed"] = seed
    values.update({k: v for k, v in optional.items() if k in io.inputs})
    return [_tensor(io, k, v) for k, v in values.items()]


def _int_outputs(result: grpcclient.InferResult, io: ModelIO) -> dict[str, int]:
    out = {}
    for name in io.outputs:
        if name == "text_output":
            continue
        arr = result.as_numpy(name)
        if arr is not None and arr.size == 1 and np.issubdtype(arr.dtype, np.integer):
            out[name] = int(arr.reshape(-1)[0])
    return out


async def run_one(
    client: grpcclient.InferenceServerClient,
    model: str,
    io: ModelIO,
    req: BenchRequest,
    timeout_s: float,
) -> RequestRecord:
    """Send `req` on its own stream and record every token's arrival; errors are recorded, never raised."""
    rec = RequestRecord(index=req.index, group=req.group, send_ns=0, num_prompt_tokens=req.num_prompt_tokens)
    inputs = build_inputs(io, req)

    async def requests() -> AsyncIterator[dict[str, object]]:
        yield {
            "model_name": model,
            "inputs": inputs,
            "request_id": str(req.index),
        }

    rec.send_wall_ns = time.time_ns()
    rec.send_ns = time.perf_counter_ns()
    last_ns = rec.send_ns
    stream = client.stream_infer(requests(), stream_timeout=timeout_s)
    try:
        # NOTE: the request stream is half-closed after the one request, so Triton ends the response stream
        # once the request's final response is sent; `triton_final_response` (when present) ends it earlier.
        async for result, error in stream:
            now = last_ns = time.perf_counter_ns()
            if error is not None:
                rec.error = error.message() if hasattr(error, "message") else str(error)
                break
            text = result.as_numpy("text_output")
            if text is not None and any(len(x) for x in text.reshape(-1)):
                rec.token_ns.append(now)
                rec.num_output_tokens += 1
            rec.server.update(_int_outputs(result, io))
            params = result.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                rec.end_ns = now
                break
        else:
            rec.end_ns = last_ns
    except InferenceServerException as exc:
        rec.error = exc.message()
    except Exception as exc:  # grpc.aio.AioRpcError (deadline, connection reset) and friends
        details = exc.details() if hasattr(exc, "details") else str(exc)
        rec.error = f"{type(exc).__name__}: {details}"
    finally:
        stream.cancel()
    if rec.error is None and rec.end_ns is None:
        rec.error = "stream ended without a final response"
    rec.num_cached_tokens = next((rec.server[n] for n in CACHED_TOKEN_OUTPUTS if n in rec.server), None)
    # NOTE: a streamed response carries one text delta; a delta may hold several tokens when the detokenizer
    # waits for a whole UTF-8 character, so the server's token count wins when it reports one.
    served = next((rec.server[n] for n in OUTPUT_TOKEN_OUTPUTS if n in rec.server), None)
    if served is not None:
        rec.num_output_tokens = served
    return rec


async def wait_ready(client: grpcclient.InferenceServerClient, model: str, timeout_s: float) -> None:
    """Wait until the server and model report ready, or raise KilnError."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            if await client.is_server_ready() and await client.is_model_ready(model):
                return
            last = "server up, model not ready"
        except InferenceServerException as exc:
            last = exc.message()
        await asyncio.sleep(0.5)
    raise KilnError(f"server/model {model!r} not ready after {timeout_s:.0f}s ({last})")
