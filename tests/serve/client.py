"""Small tritonclient helpers for the serve tests (the way users call the model)."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import tritonclient.grpc as grpcclient

from llmkiln.bench.client import grpc_inputs


@dataclass
class StreamResult:
    pieces: list[str] = field(default_factory=list)
    error: str | None = None
    final: Any = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def stream_many(
    url: str, model: str, requests: list[dict[str, Any]], timeout_s: float = 120
) -> list[StreamResult]:
    """Send every request on one gRPC stream at once; collect each one's pieces until its FINAL response."""
    results = [StreamResult() for _ in requests]
    done: queue.Queue = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        if error is not None:
            # errors carry no request id on the stream; attribute them in arrival order to unfinished ones
            done.put(("error", str(error)))
            return
        resp = result.get_response()
        r = results[int(resp.id)]
        t = result.as_numpy("text_output")
        if t is not None:
            r.pieces.append(t.reshape(-1)[0].decode())
        if resp.parameters["triton_final_response"].bool_param:
            r.final = result
            done.put(("final", int(resp.id)))

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=callback)
    try:
        for i, req in enumerate(requests):
            req = dict(req)
            inputs = grpc_inputs(req.pop("prompt"), req.pop("max_tokens"), **req)
            client.async_stream_infer(model, inputs, request_id=str(i), enable_empty_final_response=True)
        errors = []
        for _ in requests:
            kind, value = done.get(timeout=timeout_s)
            if kind == "error":
                errors.append(value)
        pending = [r for r in results if r.final is None]
        for r, e in zip(pending, errors, strict=True):
            r.error = e
    finally:
        client.stop_stream()
        client.close()
    return results


def http_generate(http_url: str, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST /v2/models/MODEL/generate (non-streaming); returns (status, JSON)."""
    req = urllib.request.Request(
        f"http://{http_url}/v2/models/{model}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def scrape(metrics_url: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(values: dict[str, float], name: str) -> float:
    """Sum of a metric over its label sets."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def cancel_storm(
    url: str, model: str, pattern: str, streams: int, clients: int, max_tokens: int, alive: Any = None
) -> int:
    """`streams` gRPC streams, `clients` at a time, each ended right after its first response: pattern `stop`
    = stop_stream(cancel_requests=True), `close` = the channel closed under the stream. Returns how many ran
    (it stops early once `alive()` is false)."""
    import threading

    left = iter(range(streams))
    lock = threading.Lock()
    done = [0]

    def one(i: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        got = threading.Event()
        client.start_stream(callback=lambda result, error: got.set())
        inputs = grpc_inputs("Once upon a time", max_tokens, stream=True)
        client.async_stream_infer(model, inputs, request_id=f"storm-{i}", enable_empty_final_response=True)
        got.wait(30)
        if pattern == "stop":
            client.stop_stream(cancel_requests=True)
        else:
            client._channel.close()  # what a client process that exits does to its streams
        client.close()

    def run() -> None:
        while alive is None or alive():
            with lock:
                i = next(left, None)
            if i is None:
                return
            try:
                one(i)
            except Exception:  # the server went away
                return
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]
