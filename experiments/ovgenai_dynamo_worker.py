"""OpenVINO GenAI's ContinuousBatchingPipeline as a Dynamo worker: the peer served through the same front door as
llmkiln (`kiln serve --dynamo`: llmkiln's OpenAI front, Dynamo's frontend, the TCP request plane), so the two
engines are compared served against served — openvino-genai ships no OpenAI server on PyPI (OpenVINO Model Server
is its server, not a pip package), and an in-process harness has no serving path at all.

Run by the launcher (llmkiln.dynamo.launcher, ClusterSpec.worker_command) in the venv of
scripts/openvino_genai_env.sh (openvino-genai + Dynamo's runtime; no llmkiln import, as
experiments/cpu_peer_openvino_genai_worker.py, whose model folder, pipeline and generation config it reuses):

    VENV/bin/python experiments/ovgenai_dynamo_worker.py --engine ENGINE_DIR [--threads N] [--overrides JSON] ...

It takes the llmkiln worker's command line (llmkiln.dynamo.worker_options) and reads what it can honour: the
engine folder (the pipeline's model folder is made from it, as the in-process peer does: the engine's own IR),
`--threads` (INFERENCE_NUM_THREADS), `scheduler.max_batch_size` and `scheduler.max_num_tokens` from --overrides or
the engine's resolved recipe (max_num_seqs, max_num_batched_tokens), the recipe's precision and serve.model_name;
the rest (KV events, roles, drain) it ignores. The pipeline's settings are otherwise the in-process peer's
(PipelineSettings: prefix caching, dynamic split-fuse, 4 GB of KV cache).

A driver process of its own drives the pipeline (`driver_main`; its `step()` holds the GIL, so a thread would
freeze the worker's event loop): it adds the requests that arrived, runs `step()` while any is unfinished, and
after every step sends each request's new tokens back, which the worker's reader thread hands to the request's
stream (the event loop's queue); with nothing to do it waits for the next request. `generate` sends the prompt's
token ids (the frontend tokenized it) and yields token ids, one chunk per step that gave the request any, the last
with the finish reason and usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import AsyncGenerator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: experiments.* (no llmkiln import)

from dynamo._core import Context
from dynamo.common.backend import (
    EngineConfig,
    GenerateChunk,
    GenerateRequest,
    LlmRegistration,
    WorkerConfig,
)
from dynamo.common.backend import LLMEngine as DynamoEngine
from dynamo.common.backend.run import run
from dynamo.common.constants import DisaggregationMode
from dynamo.llm.exceptions import EngineShutdown, InvalidArgument

from experiments.cpu_peer_openvino_genai_worker import (
    PipelineSettings,
    generation_config,
    make_model_dir,
    open_pipeline,
    read_tokens,
)

log = logging.getLogger("ovgenai.dynamo.worker")
INSTANCE_FILE_ENV = "LLMKILN_INSTANCE_FILE"  # llmkiln.dynamo.cluster: the launcher's record of this instance
IDLE_WAIT_S = 0.05


def _recipe(engine: Path) -> dict[str, Any]:
    import yaml

    path = engine / "recipe.resolved.yaml"
    if not path.is_file():
        raise SystemExit(f"{engine}: no recipe.resolved.yaml: give an llmkiln openvino-cpu engine folder")
    return yaml.safe_load(path.read_text()) or {}


class Stream:
    """One request's side of the worker: its tokens as they come (a None ends it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[list[int], str | None] | None] = asyncio.Queue()
        self.n_out = 0

    def put(self, item: tuple[list[int], str | None] | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


# ---------------------------------------------------------------------------------------------------------------
# The driver process: the pipeline's only caller. openvino-genai's step() holds the GIL for the whole step (a
# Python thread beside it does not run at all), so a driver thread in the worker would stall the worker's event
# loop — requests in, tokens out — for every step; OpenVINO Model Server drives the pipeline from C++ threads.
# Here it gets a process of its own, and JSON lines on its stdin/stdout:
#   in:  {"op": "add", "id": N, "ids": [...], "max": M, "ignore_eos": bool, "stops": [...]}  |  {"op": "drop", "id": N}
#   out: {"ready": {...}} once, then {"id": N, "t": [new tokens], "r": null | "length" | "stop" | "error: ..."}


def driver_main(model_dir: Path, precision: str, settings: PipelineSettings) -> None:
    import select

    import numpy as np
    import openvino as ov
    import openvino_genai as og  # type: ignore[import-not-found]

    try:  # the kernel ends this process with its worker (stdin's EOF is seen only between steps)
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    # the protocol's own copy of stdout; fd 1 (OpenVINO's prints) goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    pipe, facts = open_pipeline(og, model_dir, precision, settings)
    out.write(
        json.dumps({"ready": {"compiled": facts.get("compiled"), "load_s": facts.get("load_s")}}) + "\n"
    )
    out.flush()
    running = og.GenerationStatus.RUNNING
    fd = sys.stdin.fileno()
    buf = b""
    live: dict[int, tuple[Any, int]] = {}  # id -> (handle, max tokens)
    dropped: set[int] = set()
    emitted: dict[int, int] = {}

    def emit(rid: int, toks: list[int], reason: str | None) -> None:
        out.write(json.dumps({"id": rid, "t": toks, "r": reason}) + "\n")

    while True:
        ready, _, _ = select.select([fd], [], [], 0 if live else IDLE_WAIT_S)
        if ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return  # the worker is gone
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                rid = int(msg["id"])
                if msg["op"] == "drop":
                    if rid in live:  # an ended request has nothing to drop
                        dropped.add(rid)
                    continue
                cfg = generation_config(og, int(msg["max"]), bool(msg["ignore_eos"]), msg["stops"], settings)
                try:
                    handle = pipe.add_request(rid, ov.Tensor(np.asarray([msg["ids"]], np.int64)), cfg)
                except Exception as exc:  # refused: the request ends with the reason
                    emit(rid, [], f"error: {type(exc).__name__}: {exc}")
                    continue
                live[rid] = (handle, cfg.max_new_tokens)
                emitted[rid] = 0
        if not live:
            out.flush()
            continue
        pipe.step()
        for rid in list(live):
            handle, max_tokens = live[rid]
            got = read_tokens(handle)
            emitted[rid] += len(got)
            status = handle.get_status()
            if rid in dropped:
                handle.drop()
                reason: str | None = "cancelled"
            elif status == running:
                if got:
                    emit(rid, got, None)
                continue
            elif getattr(status, "name", str(status)) != "FINISHED":
                reason = (
                    f"error: the pipeline ended the request with status {getattr(status, 'name', status)}"
                )
            else:
                reason = "length" if emitted[rid] >= max_tokens else "stop"
            emit(rid, got, reason)
            del live[rid]
            dropped.discard(rid)
            del emitted[rid]
        out.flush()


class DriverClient:
    """The worker's end of the driver process: a writer thread (a write never blocks the event loop, even when
    the driver is inside a step and the pipe is full) and a reader thread that hands tokens to the streams."""

    def __init__(self, command: list[str]) -> None:
        import subprocess

        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        self.streams: dict[int, Stream] = {}
        self.ready: dict[str, Any] = {}
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="ovgenai-driver-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="ovgenai-driver-writer", daemon=True)
        self._ready = threading.Event()

    def start(self, timeout_s: float) -> dict[str, Any]:
        self._reader.start()
        self._writer.start()
        if not self._ready.wait(timeout_s) or not self.ready:
            raise RuntimeError(f"the OpenVINO GenAI driver did not start (exit code {self.proc.poll()})")
        return self.ready

    def send(self, msg: dict[str, Any]) -> None:
        self._outbox.put(json.dumps(msg).encode() + b"\n")

    def _write(self) -> None:
        while (data := self._outbox.get()) is not None:
            try:
                self._in.write(data)
            except (BrokenPipeError, ValueError):
                return

    def _read(self) -> None:
        for line in self._out:
            msg = json.loads(line)
            if "ready" in msg:
                self.ready = msg["ready"]
                self._ready.set()
                continue
            stream = self.streams.get(int(msg["id"]))
            if stream is None:
                continue
            stream.put((msg["t"], msg["r"]))
            if msg["r"] is not None:
                stream.put(None)
                self.streams.pop(int(msg["id"]), None)
        self._ready.set()
        for stream in list(self.streams.values()):  # the driver died: every stream ends with an error
            stream.put(([], f"error: the OpenVINO GenAI driver exited ({self.proc.poll()})"))
            stream.put(None)
        self.streams.clear()

    def close(self, timeout_s: float = 10.0) -> None:
        import subprocess

        self._outbox.put(None)
        try:
            self._in.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class GenAIWorker(DynamoEngine):
    def __init__(self, engine: Path, settings: PipelineSettings, precision: str, ctx: int) -> None:
        self.engine, self.settings, self.precision, self.ctx = engine, settings, precision, ctx
        self.driver: DriverClient | None = None
        self._next_id = 0
        self._ids: dict[str, int] = {}  # Dynamo's request id -> the driver's

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[GenAIWorker, WorkerConfig]:
        ap = argparse.ArgumentParser(
            description="OpenVINO GenAI as a Dynamo worker (llmkiln's worker arguments)"
        )
        ap.add_argument("--engine", type=Path, required=True)
        ap.add_argument("--threads", type=int, default=0)
        ap.add_argument("--overrides", default="{}")
        ap.add_argument("--namespace", default="llmkiln")
        ap.add_argument("--component", default="backend")
        ap.add_argument("--endpoint", default="generate")
        ap.add_argument("--served-model-name", default=None)
        args, _ignored = ap.parse_known_args(argv if argv is not None else sys.argv[1:])
        engine = args.engine.resolve()
        recipe = _recipe(engine)
        overrides = json.loads(args.overrides)
        sched = {**(recipe.get("scheduler") or {}), **(overrides.get("scheduler") or {})}
        threads = args.threads or int(sched.get("intra_op_threads") or 0) or (os.cpu_count() or 1)
        settings = replace(
            PipelineSettings(),
            max_num_seqs=int(sched.get("max_batch_size") or 8),
            max_num_batched_tokens=int(sched.get("max_num_tokens") or 1024),
            threads=threads,
        )
        name = args.served_model_name or (recipe.get("serve") or {}).get("model_name") or engine.name
        ctx = int((recipe.get("limits") or {}).get("max_seq_len") or 4096)
        worker = cls(engine, settings, str(recipe.get("precision") or "fp32"), ctx)
        cfg = WorkerConfig(
            namespace=args.namespace,
            component=args.component,
            endpoint=args.endpoint,
            model_name=str(engine),
            served_model_name=name,
            endpoint_types="chat,completions",
            discovery_backend=os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
            request_plane="tcp",
            event_plane="zmq",
            enable_kv_routing=False,
            disaggregation_mode=DisaggregationMode.AGGREGATED,
        )
        return worker, cfg

    async def start(self, worker_id: int) -> EngineConfig:
        record = os.environ.get(INSTANCE_FILE_ENV)
        if record:  # as llmkiln.dynamo.registration.record_instance (not importable here): whole, owner-only
            path = Path(record)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"instance_id": worker_id, "pid": os.getpid()}))
            tmp.chmod(0o600)
            os.replace(tmp, path)
        models = Path(os.environ.get("LLMKILN_OVGENAI_MODELS", "/tmp/llmkiln-ovgenai/models"))
        model_dir = models / self.engine.name
        await asyncio.to_thread(make_model_dir, self.engine, model_dir)
        command = [sys.executable, str(Path(__file__).resolve()), "--driver", str(model_dir), self.precision]
        self.driver = DriverClient([*command, json.dumps(asdict(self.settings))])
        ready = await asyncio.to_thread(self.driver.start, 600.0)
        log.info("OpenVINO GenAI pipeline ready: %s, %s", ready, self.settings)
        return EngineConfig(
            model=str(self.engine),
            served_model_name=None,
            llm=LlmRegistration(
                context_length=self.ctx,
                kv_cache_block_size=32,
                total_kv_blocks=1,
                max_num_seqs=self.settings.max_num_seqs,
                max_num_batched_tokens=self.settings.max_num_batched_tokens,
            ),
        )

    async def abort(self, context: Context) -> None:
        rid = self._ids.get(context.id())
        if rid is not None and self.driver is not None:
            self.driver.send({"op": "drop", "id": rid})

    async def cleanup(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            await asyncio.to_thread(driver.close)

    def _request(self, request: GenerateRequest, rid: int, ids: list[int]) -> dict[str, Any]:
        """The driver's "add" message: greedy, max_tokens (default: the rest of the context), EOS as asked."""
        so = request.get("sampling_options") or {}
        sc = request.get("stop_conditions") or {}
        if so.get("temperature") not in (None, 0, 0.0):
            raise InvalidArgument("this peer serves greedy requests only (temperature 0)")
        max_tokens = sc.get("max_tokens")
        stops = {int(t) for t in (sc.get("stop_token_ids_hidden") or ())}
        stops |= {int(t) for t in (sc.get("stop_token_ids") or ())}
        return {
            "op": "add",
            "id": rid,
            "ids": ids,
            "max": int(max_tokens) if max_tokens is not None else max(1, self.ctx - len(ids)),
            "ignore_eos": bool(sc.get("ignore_eos")),
            "stops": sorted(stops),
        }

    async def generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateChunk, None]:
        driver = self.driver
        if driver is None:
            raise EngineShutdown("the worker is not running")
        if driver.proc.poll() is not None:  # its reader has ended every stream: a new one would wait forever
            raise EngineShutdown(f"the OpenVINO GenAI driver exited ({driver.proc.returncode})")
        ids = [int(t) for t in request["token_ids"]]
        self._next_id += 1
        rid = self._next_id
        msg = self._request(request, rid, ids)
        stream = Stream(asyncio.get_running_loop())
        driver.streams[rid] = stream
        self._ids[context.id()] = rid
        driver.send(msg)
        ended = False
        try:
            while True:
                item = await stream.queue.get()
                if item is None:
                    ended = True
                    return
                toks, reason = item
                stream.n_out += len(toks)
                if reason is None:
                    yield {"token_ids": toks, "index": 0}
                    continue
                if reason.startswith("error: "):
                    ended = True
                    raise EngineShutdown(reason[len("error: ") :])
                yield {
                    "token_ids": toks,
                    "index": 0,
                    "finish_reason": "length" if reason == "length" else "stop",
                    "completion_usage": {
                        "prompt_tokens": len(ids),
                        "completion_tokens": stream.n_out,
                        "total_tokens": len(ids) + stream.n_out,
                    },
                }
        finally:
            self._ids.pop(context.id(), None)
            if not ended and rid in driver.streams:  # the client left: the driver drops it at its next step
                driver.streams.pop(rid, None)
                driver.send({"op": "drop", "id": rid})


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--driver":
        settings = PipelineSettings.from_dict(json.loads(sys.argv[4]))
        driver_main(Path(sys.argv[2]), sys.argv[3], settings)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(GenAIWorker)


if __name__ == "__main__":
    main()
