"""No head-of-line stalls: a request at the size limits does not hold up the others.

The one relative latency check the issue asks for (other checks are functional): the time to first token of
small streaming requests sent while a maximal-size request is being handled, against the same small requests
sent while a normal-size request of the same length is handled, in one run, median over 30 of each,
interleaved so drift on a shared machine hits both alike.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from llmkiln.recipe import Serve, Warmup
from llmkiln.serve.repository import spec_from_engine, write_repository
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports

from .client import grpc_inputs

pytestmark = pytest.mark.slow

ROUNDS = 30
LIMITS = Serve()  # the default request size limits


COMPANION_TOKENS = 64
NORMAL = {"prompt": "Once upon a time", "max_tokens": COMPANION_TOKENS}


def _maximal(round_: int) -> dict:
    """A request at the default limits: the largest prompt, or the most and longest stop strings."""
    words = np.array([[(f"{i:03d}" + "z" * LIMITS.max_stop_word_bytes)[: LIMITS.max_stop_word_bytes].encode()
                       for i in range(LIMITS.max_stop_words)]], dtype=np.object_)  # fmt: skip
    if round_ % 2 == 0:
        prompt = ("Once upon a time there was a little dog. " * 10_000)[: LIMITS.max_prompt_bytes]
        return {"prompt": prompt, "max_tokens": COMPANION_TOKENS, "stop_words": words}
    return {**NORMAL, "stop_words": words}


class Client:
    def __init__(self, url: str) -> None:
        self.q: queue.Queue = queue.Queue()
        self.c = grpcclient.InferenceServerClient(url)
        self.c.start_stream(callback=lambda result, error: self.q.put((time.perf_counter(), result, error)))

    def ttft(self, prompt: str) -> float:
        """Seconds from sending a small streaming request to its first response; waits for its end."""
        t0 = time.perf_counter()
        self.c.async_stream_infer(
            "llmkiln", grpc_inputs(prompt, 8, stream=True), enable_empty_final_response=True
        )
        first = None
        while True:
            t, result, error = self.q.get(timeout=60)
            assert error is None, error
            first = first if first is not None else t
            if result.get_response().parameters["triton_final_response"].bool_param:
                return first - t0

    def close(self) -> None:
        self.c.stop_stream()
        self.c.close()


def _send_companion(url: str, req: dict, done: threading.Event) -> None:
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    extra = {k: v for k, v in req.items() if k not in ("prompt", "max_tokens")}
    c.async_stream_infer("llmkiln", grpc_inputs(req["prompt"], req["max_tokens"], stream=True, **extra),
                         enable_empty_final_response=True)  # fmt: skip
    while True:
        result, error = q.get(timeout=120)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            break
    c.stop_stream()
    c.close()
    done.set()


def test_a_maximal_request_leaves_others_ttft_within_2x(engine_factory, tmp_path: Path):
    engine = engine_factory("stories-fp32")
    spec = spec_from_engine(engine)
    spec.warmup = Warmup(prompts=["Once upon a time"], count=1, max_tokens=2)
    # one onnxruntime thread: the other core is left to tokenization and Triton (a 2-core CI machine)
    spec.engine_overrides = {"scheduler": {"intra_op_threads": 1}}
    write_repository(spec, tmp_path / "repo")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerConfig(tmp_path / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                                       exit_timeout_s=10, workdir=tmp_path / "work"))  # fmt: skip
    server.start()
    client = None
    try:
        server.wait_ready(300)
        client = Client(server.url_grpc)
        for _ in range(5):
            client.ttft("Lily had a red ball.")  # warm
        normal, during = [], []
        for r in range(ROUNDS):
            for companion, out in ((NORMAL, normal), (_maximal(r), during)):
                done = threading.Event()
                args = (server.url_grpc, companion, done)
                threading.Thread(target=_send_companion, args=args, daemon=True).start()
                time.sleep(0.02)  # the companion is being parsed / tokenized / streamed now
                out.append(client.ttft(f"Tom saw a big cat {r}."))
                assert done.wait(120)
        m_normal, m_during = statistics.median(normal), statistics.median(during)
        print(
            f"TTFT median beside a normal request {m_normal * 1e3:.1f} ms, "
            f"beside a maximal one {m_during * 1e3:.1f} ms"
        )
        assert m_during <= 2 * m_normal, (sorted(normal), sorted(during))
    finally:
        if client is not None:
            client.close()
        server.stop()
