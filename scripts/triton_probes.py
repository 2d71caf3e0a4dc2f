"""Measure what the bundled Triton 2.51 does, with a minimal python-backend model (not run in CI).

  .venv/bin/python scripts/triton_probes.py error-codes   # HTTP status of /generate per TritonError code
  .venv/bin/python scripts/triton_probes.py stub-death    # health and an in-flight stream after the stub is killed
  .venv/bin/python scripts/triton_probes.py generate-json # what Triton's own /generate makes of odd JSON
  .venv/bin/python scripts/triton_probes.py tokenizer-gil # does Tokenizer.encode / encode_batch hold the GIL?
  .venv/bin/python scripts/triton_probes.py closed-streams [N] # SIGTERM after N streams closed by channel close
  .venv/bin/python scripts/triton_probes.py stub-pdeathsig # PR_SET_PDEATHSIG set in the stub's initialize
  .venv/bin/python scripts/triton_probes.py cancel-storm [stop|close] [plain|careful] [STREAMS] [CLIENTS]
                                                          # gRPC clients that cancel streams: does Triton survive?

The findings are in docs/serve.md (Reliability). The server is started bare (`llmkiln.serve.server`'s command,
no llmkiln watchdog), on free loopback ports, and stopped at the end.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.serve.server import ServerConfig, TritonServer, free_ports

MODEL = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    async def execute(self, requests):
        for r in requests:
            asyncio.get_running_loop().create_task(self.one(r))
        return None

    async def one(self, r):
        what = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0].decode()
        s = r.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        out = lambda t: pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("text_output", np.array([[t]], dtype=object))])
        if what == "ok":
            s.send(out(b"x"), flags=final)
        elif what == "echo":  # the max_tokens value the model received
            n = pb_utils.get_input_tensor_by_name(r, "max_tokens").as_numpy().reshape(-1)[0]
            s.send(out(str(int(n)).encode()), flags=final)
        elif what == "two":  # two responses, as a streaming request gets
            s.send(out(b"a"))
            s.send(out(b"b"), flags=final)
        elif what.startswith("last:"):  # like ServeCore: N pieces 1 ms apart, the final flag on the last one
            n = int(what.split(":")[1])
            for i in range(n):
                await asyncio.sleep(0.001)
                s.send(out(b"."), flags=final if i == n - 1 else 0)
        elif what.split(":")[0] in ("plain", "careful"):  # 64 pieces as fast as the loop goes, then final
            # plain|careful[:MS[:PIECES[:GAP_MS]]]: GAP_MS between pieces keeps a request in flight longer
            mode, delay_ms, pieces, gap_ms = (what.split(":") + ["0", "64", "0"][len(what.split(":")) - 1 :])[:4]
            for _ in range(int(pieces)):
                if mode == "careful" and r.is_cancelled():  # no piece after a cancel, only the final flag
                    await asyncio.sleep(int(delay_ms) / 1000)  # careful:MS waits MS before it
                    break
                s.send(out(b"."))
                await asyncio.sleep(int(gap_ms) / 1000)
            s.send(flags=final)
        elif what == "slow":  # one piece every 10 ms for 100 s
            for _ in range(10_000):
                s.send(out(b"."))
                await asyncio.sleep(0.01)
            s.send(flags=final)
        else:
            err = pb_utils.TritonError("model error " + what, getattr(pb_utils.TritonError, what))
            s.send(pb_utils.InferenceResponse(error=err), flags=final)
"""


def _repository(root: Path) -> Path:
    model = root / "repo" / "probe"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    cfg = mc.ModelConfig(name="probe", backend="python", max_batch_size=1)
    cfg.model_transaction_policy.decoupled = True
    cfg.input.append(mc.ModelInput(name="text_input", data_type=mc.TYPE_STRING, dims=[1]))
    cfg.input.append(mc.ModelInput(name="max_tokens", data_type=mc.TYPE_INT32, dims=[1], optional=True))
    cfg.output.append(mc.ModelOutput(name="text_output", data_type=mc.TYPE_STRING, dims=[-1]))
    cfg.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    (model / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    return root / "repo"


def _status(url: str, body: bytes | None = None) -> int | str:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return type(e).__name__


def error_codes(server: TritonServer) -> None:
    for code in ("ok", "UNAVAILABLE", "INTERNAL", "INVALID_ARG", "NOT_FOUND", "UNSUPPORTED", "CANCELLED"):
        body = json.dumps({"text_input": code}).encode()
        print(f"{code:12s} -> HTTP {_status(f'http://{server.url_http}/v2/models/probe/generate', body)}")


def stub_death(server: TritonServer, seconds: float = 30.0) -> None:
    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url_grpc)
    c.start_stream(callback=lambda result, error: q.put((time.monotonic(), error)))
    t = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    t.set_data_from_numpy(np.array([[b"slow"]], dtype=object))
    c.async_stream_infer("probe", [t], enable_empty_final_response=True)
    q.get(timeout=30)
    [stub] = [p for p in server.leftover_processes() if p != server.proc.pid]  # type: ignore[union-attr]
    os.kill(stub, signal.SIGKILL)
    t0 = time.monotonic()
    last = None
    pieces, errors = 0, 0
    while time.monotonic() - t0 < seconds:
        base = f"http://{server.url_http}/v2"
        state = (
            _status(f"{base}/health/ready"),
            _status(f"{base}/health/live"),
            _status(f"{base}/models/probe/ready"),
        )
        if state != last:
            print(f"{time.monotonic() - t0:6.2f} s after the kill: ready/live/model-ready = {state}")
            last = state
        while not q.empty():
            when, error = q.get()
            if error is not None:
                errors += 1
                print(f"{when - t0:6.2f} s: the in-flight stream got an error: {error}")
            elif when > t0:
                pieces += 1
        time.sleep(0.5)
    print(f"after {seconds:.0f} s: {pieces} stream responses and {errors} errors since the kill")
    c.stop_stream(cancel_requests=True)
    c.close()


def generate_json(server: TritonServer) -> None:
    """The model echoes nothing useful here; what matters is Triton's answer before the model sees a request."""
    url = f"http://{server.url_http}/v2/models/probe/generate"
    for label, body in (
        ("max_tokens 4294967301", b'{"text_input": "echo", "max_tokens": 4294967301}'),
        ("max_tokens as a string", b'{"text_input": "echo", "max_tokens": "3"}'),
        ("text_input as a number", b'{"text_input": 5}'),
        ("two responses on /generate", b'{"text_input": "two"}'),
    ):
        req = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        print(f"{label:28s} -> HTTP {status} {text[:150].decode(errors='replace')}")


def cancel_storm(server: TritonServer, pattern: str, mode: str, streams: int, clients: int) -> None:
    """STREAMS gRPC streams, CLIENTS at a time, each ended right after its first response: `stop` =
    stop_stream(cancel_requests=True), `close` = close the channel. The model is `plain` (ignores cancellation)
    or `careful` (checks is_cancelled() before every send; after a cancel it sends only the final flag)."""
    import threading

    t = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    t.set_data_from_numpy(np.array([[mode.encode()]], dtype=object))
    left = iter(range(streams))
    lock = threading.Lock()
    done = [0]

    def one(i: int) -> None:
        c = grpcclient.InferenceServerClient(server.url_grpc)
        got = threading.Event()
        c.start_stream(callback=lambda result, error: got.set())
        c.async_stream_infer("probe", [t], request_id=str(i), enable_empty_final_response=True)
        got.wait(10)
        if pattern == "stop":
            c.stop_stream(cancel_requests=True)
        else:  # the channel goes away under the stream (what a client process exiting does)
            c._channel.close()
        c.close()

    def client() -> None:
        while server.proc is not None and server.proc.poll() is None:
            with lock:
                i = next(left, None)
            if i is None:
                return
            try:
                one(i)
            except Exception:  # the server died under us
                return
            with lock:
                done[0] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    time.sleep(1)
    code = server.proc.poll() if server.proc is not None else None
    alive = "alive" if code is None else f"DEAD (exit code {code})"
    print(
        f"{pattern}/{mode}: {done[0]} of {streams} streams in {time.monotonic() - t0:.1f} s; tritonserver {alive}"
    )
    if code is not None:
        print(server.last_lines(12))


def tokenizer_gil() -> None:
    """Longest pause of a 1 ms ticker thread while another thread tokenizes 1 MB of text."""
    import threading

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(
        str(Path(__file__).resolve().parents[2] / "shared/models/stories260K/tokenizer.json")
    )
    text = ("Once upon a time there was a little dog named Max. " * 20_000)[:1_000_000]
    for name, call in (
        ("encode", lambda: tok.encode(text)),
        ("encode_batch", lambda: tok.encode_batch([text])),
    ):
        gaps: list[float] = []
        done = threading.Event()

        def tick(done: threading.Event = done, gaps: list[float] = gaps) -> None:
            last = time.perf_counter()
            while not done.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        t0 = time.perf_counter()
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
        took = time.perf_counter() - t0
        done.set()
        ticker.join()
        print(f"{name:12s}: {took:.2f} s for 1 MB; longest pause of the other thread {max(gaps):.3f} s")


def _bare_server(tmp: Path, model_py: str = MODEL, exit_timeout_s: int = 3) -> TritonServer:
    repo = _repository(tmp)
    (repo / "probe" / "1" / "model.py").write_text(model_py)
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(repo, http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_s=exit_timeout_s,
                       workdir=tmp / "work")  # fmt: skip
    server = TritonServer(cfg)
    server.start()
    server.wait_ready(120)
    server.stop_requested.set()  # a bare server: no llmkiln watchdog reaction
    return server


def closed_streams(n: int) -> None:
    """N streams, each read to its final response, then ended by tritonclient's close() (the stream is half-closed
    first) or by closing the channel (the stream RPC is cancelled); then SIGTERM with nothing in flight."""
    for how in ("close()", "channel.close()"):
        with tempfile.TemporaryDirectory(prefix="llmkiln-probe-") as tmp:
            server = _bare_server(Path(tmp), exit_timeout_s=8)
            for _ in range(n):
                q: queue.Queue = queue.Queue()
                c = grpcclient.InferenceServerClient(server.url_grpc)
                c.start_stream(callback=lambda result, error, q=q: q.put((result, error)))
                t = grpcclient.InferInput("text_input", [1, 1], "BYTES")
                t.set_data_from_numpy(np.array([[b"two"]], dtype=object))
                c.async_stream_infer("probe", [t], enable_empty_final_response=True)
                while not q.get(timeout=30)[0].get_response().parameters["triton_final_response"].bool_param:
                    pass
                c.close() if how == "close()" else c._channel.close()
            time.sleep(0.5)
            t0 = time.monotonic()
            server.terminate()
            code = server.wait_exit()
            live = [ln for ln in server.lines if "live models" in ln][-1:]
            print(
                f"{n} streams ended by {how}: tritonserver exit {code} after {time.monotonic() - t0:.1f} s; {live}"
            )


def stub_pdeathsig() -> None:
    """The parent-death signal follows the parent *thread*: is the stub forked by a thread that lives on?"""
    model = MODEL.replace(
        "    def initialize(self, args):\n        pass\n",
        "    def initialize(self, args):\n        import ctypes, signal\n"
        "        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n",
    )
    with tempfile.TemporaryDirectory(prefix="llmkiln-probe-") as tmp:
        server = _bare_server(Path(tmp), model_py=model)
        assert server.proc is not None
        time.sleep(2)
        stubs = [p for p in server.leftover_processes() if p != server.proc.pid]
        print(f"2 s after READY, with PR_SET_PDEATHSIG set in initialize: {len(stubs)} stub(s) alive; "
              f"tritonserver alive: {server.proc.poll() is None}")  # fmt: skip
        server.stop(10)


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "error-codes"
    if what == "tokenizer-gil":
        tokenizer_gil()
        return
    if what == "closed-streams":
        closed_streams(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
        return
    if what == "stub-pdeathsig":
        stub_pdeathsig()
        return
    with tempfile.TemporaryDirectory(prefix="llmkiln-probe-") as tmp:
        http, grpc, metrics = free_ports(3)
        cfg = ServerConfig(_repository(Path(tmp)), http_port=http, grpc_port=grpc, metrics_port=metrics,
                           exit_timeout_s=3, workdir=Path(tmp) / "work")  # fmt: skip
        server = TritonServer(cfg)
        server.start()
        try:
            server.wait_ready(120)
            server.stop_requested.set()  # a bare server: no llmkiln watchdog reaction
            if what == "cancel-storm":
                pattern, mode, *rest = sys.argv[2:] + ["stop", "plain"][len(sys.argv[2:]) :]
                numbers = [int(x) for x in rest] + [2000, 16][len(rest) :]
                cancel_storm(server, pattern, mode, numbers[0], numbers[1])
                return
            {"error-codes": error_codes, "stub-death": stub_death, "generate-json": generate_json}[what](
                server
            )
        finally:
            server.stop(10)


if __name__ == "__main__":
    main()
