"""EngineHost: one engine folder hosted for one front door.

    host = EngineHost.open("engines/stories-fp32", HostOptions())   # check, load, start
    host.warmup()                       # the recipe's warmup (prefixes, then prompts) before ready
    host.health()                       # ready / healthy / draining, and why not
    host.refresh_metrics(); host.metrics # one naming for every front door (llmkiln.host.metrics)
    host.refusal()                      # why a new request is refused now (draining, shut down) or None
    host.begin_drain(); host.end_overdue(); host.is_quiescent   # drain; the caller keeps the deadline
    host.shutdown(timeout_s)

`check_engine` (llmkiln.host.check) is the one way from what a user typed to an engine that may be served; the
launchers call it before they start anything, the host again right before it loads the files.

The front doors are protocol adapters on the host: llmkiln.serve.handler (Triton python backend) and
llmkiln.dynamo.worker (Dynamo's Python engine contract). Roles (llmkiln.host.roles) say what part of a request's
life a host serves; a prefill or decode host owns a KV transfer agent (`host.kv`, llmkiln.host.kv_transfer).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from llmkiln.cpu_features import SETTING_PREFIX, detect
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.host.check import check_engine
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_connector import KvConnector
from llmkiln.host.kv_transfer import KvTransfer
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.metrics import HostMetrics, exposition
from llmkiln.host.request_life import Refused, RequestLife
from llmkiln.host.roles import WorkerRole
from llmkiln.host.warmup import WarmupResult, run_warmup
from llmkiln.recipe import Warmup
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.profile import PROFILE_ENV
from llmkiln.runtime.protocol import ServingEngine, ServingHandle

SHUTTING_DOWN = "llmkiln: the server is shutting down; retry on another replica or after it restarts"


class HostLog(Protocol):
    """Where the host's lines go (logging.Logger, or the Triton stub's logger through an adapter)."""

    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None: ...

    def error(self, msg: str) -> None: ...


DEFAULT_STALL_TIMEOUT_S = 30.0  # the recipe's serve.stall_timeout_s default, for engines without a recipe


@dataclass(frozen=True)
class Health:
    """ready: warmed, healthy, live and not draining (take traffic); healthy: the engine's thread runs; live: it
    made progress within the stall bound while requests were in flight."""

    ready: bool
    healthy: bool
    draining: bool
    reason: str | None = None
    live: bool = True


class EngineHost:
    """A started engine and what every front door does around it (see the module docstring)."""

    def __init__(
        self,
        engine: ServingEngine,
        folder: EngineDir | None = None,
        role: WorkerRole = WorkerRole.AGGREGATED,
        log: HostLog | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        self.engine = engine
        self._stall_timeout_s = stall_timeout_s
        self.folder = folder
        self.role = role
        self.log: HostLog = log if log is not None else logging.getLogger("llmkiln.host")
        self.metrics = HostMetrics()
        self.metrics.settings = dict(engine.runtime_settings)
        self.load_seconds = 0.0
        self.warmup_result: WarmupResult | None = None
        self._lock = threading.Lock()
        self._handles: set[ServingHandle] = set()
        self._active = 0
        self._draining = False
        self._ending = False
        self._closed = False
        self.kv: KvTransfer | None = None  # prefill/decode roles (attach_kv_transfer)
        # what each request's KV does across engines (host.kv_connector); the aggregated one does nothing
        self.connector = KvConnector(WorkerRole.AGGREGATED, self.metrics)

    @classmethod
    def open(
        cls,
        engine: str | os.PathLike[str] | EngineDir,
        options: HostOptions | None = None,
        log: HostLog | None = None,
    ) -> EngineHost:
        """Check (check_engine), load and start the engine; not warmed yet (call warmup())."""
        opts = options or HostOptions()
        t0 = time.perf_counter()
        folder = check_engine(engine, opts.engines_root)
        overrides = opts.engine_overrides(folder.recipe())
        # the last line before native code runs: a worker that dies loading says what it was loading, where
        cpu = detect()
        log = log if log is not None else logging.getLogger("llmkiln.host")
        log.info(
            f"llmkiln: loading engine {folder.path} on {cpu.model} ({cpu.kind}, {cpu.cores} core(s))"
            + (f" with overrides {json.dumps(overrides, sort_keys=True)}" if overrides else "")
        )
        eng = load_engine(folder, overrides or None)
        profile = opts.profile or os.environ.get(PROFILE_ENV)
        if profile:
            eng.enable_profile(profile)
        eng.compute_priority = opts.compute_priority
        eng.start()
        host = cls(eng, folder, opts.role, log)
        if opts.role.moves_kv:
            try:
                host.attach_kv_transfer(opts.kv)
            except BaseException:
                eng.shutdown(0.0)
                raise
        host.load_seconds = time.perf_counter() - t0
        settings = ", ".join(
            f"{k}={v}" for k, v in eng.runtime_settings.items() if not k.startswith(SETTING_PREFIX)
        )
        host.log.info(f"llmkiln: engine {folder.path} loaded in {host.load_seconds:.2f} s ({settings})")
        return host

    def attach_kv_transfer(self, options: KvTransferOptions | None = None) -> KvTransfer:
        """The NIXL agent of a prefill or decode host (the engine must be an LLMEngine with a prefix store)."""
        if not isinstance(self.engine, LLMEngine):
            raise BadInput(f"the {self.role.value} role needs the CPU runtime's engine")
        self.kv = KvTransfer(self.engine, self.role, self.metrics, options, log=self.log)
        self.connector = KvConnector(self.role, self.metrics, self.kv)
        self.log.info(f"llmkiln: {self.role.value} host: NIXL agent {self.kv.name}")
        return self.kv

    # ------------------------------------------------------------------ warmup and health
    @property
    def warmup_section(self) -> Warmup:
        recipe = self.engine.recipe
        return recipe.warmup if recipe is not None else Warmup(count=0)

    def warmup(self, warmup: Warmup | None = None) -> WarmupResult:
        """Run the warmup (default: the engine's recipe's) before ready; WarmupFailed if a request fails."""
        section = warmup if warmup is not None else self.warmup_section
        try:
            result = run_warmup(self.engine, section)
        except Exception as exc:
            self.log.error(f"llmkiln: a warmup request failed, the model stays not ready: {exc}")
            raise
        self.warmup_result = result
        self.metrics.add("warmup_requests", result.requests)
        self.metrics.set("warmup_seconds", result.seconds)
        self.log.info(f"llmkiln: warmup done: {result.requests} requests in {result.seconds:.3f} s")
        return result

    @property
    def stall_timeout_s(self) -> float:
        """The liveness bound: the recipe's serve.stall_timeout_s unless given."""
        if self._stall_timeout_s is not None:
            return self._stall_timeout_s
        recipe = self.engine.recipe
        return recipe.serve.stall_timeout_s if recipe is not None else DEFAULT_STALL_TIMEOUT_S

    def health(self) -> Health:
        eng = self.engine
        if not eng.healthy:
            return Health(False, False, self._draining, f"engine failed: {eng.failure}")
        stalled = eng.stalled_for_s
        if stalled > self.stall_timeout_s:
            return Health(
                False,
                True,
                self._draining,
                f"stalled: no engine step for {stalled:.0f} s with {eng.num_in_flight} request(s) in flight "
                f"(serve.stall_timeout_s = {self.stall_timeout_s:g})",
                live=False,
            )
        if self._closed:
            return Health(False, False, True, "shut down")
        if self._draining:
            return Health(False, True, True, "draining")
        if self.warmup_result is None:
            return Health(False, True, False, "warming up")
        return Health(True, True, False)

    def refresh_metrics(self) -> HostMetrics:
        """Take the engine's counters into the host's metrics (front doors call it before they publish)."""
        self.metrics.observe_engine(self.engine.metrics(), self.engine.healthy, self.engine.stalled_for_s)
        return self.metrics

    def exposition(self, labels: Mapping[str, str] | None = None) -> str:
        """Prometheus text of the host's metrics (the Dynamo worker's /metrics)."""
        self.refresh_metrics()
        return exposition(self.metrics, labels)

    # ------------------------------------------------------------------ requests
    @contextmanager
    def serving(self) -> Iterator[RequestLife]:
        """One request's life (host.request_life): Refused (counted) when refusal() says so; otherwise active
        until the block ends, its handle tracked for the drain deadline once submitted."""
        refused = self.refusal()
        if refused is not None:
            self.metrics.add("rejected")
            raise Refused(refused)
        self.request_started()
        life = RequestLife(self)
        try:
            yield life
        finally:
            if life.handle is not None:
                self.untrack(life.handle)
            self.request_ended()

    def refusal(self) -> str | None:
        """Why a new request must be refused now (draining or shut down), None when it may be submitted."""
        if self._draining or self._closed:
            return SHUTTING_DOWN
        return None

    def request_started(self) -> None:
        with self._lock:
            self._active += 1
            n = self._active
        self.metrics.set("active", n)

    def request_ended(self) -> None:
        with self._lock:
            self._active -= 1
            n = self._active
        self.metrics.set("active", n)

    @property
    def num_active(self) -> int:
        """Requests the front door is serving (parsed, queued, running or streaming)."""
        return self._active

    def track(self, handle: ServingHandle) -> None:
        """A submitted request, cancelled at the drain deadline if still running (end_overdue)."""
        with self._lock:
            self._handles.add(handle)

    def untrack(self, handle: ServingHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    # ------------------------------------------------------------------ drain and shutdown
    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def ending(self) -> bool:
        """True once the drain deadline passed: requests still running were cancelled by the host."""
        return self._ending

    def begin_drain(self) -> None:
        """Refuse new requests from now on (refusal()); those in flight go on."""
        if not self._draining:
            self._draining = True
            self.log.info(
                f"llmkiln: draining: {self._active} request(s) in flight, new requests get UNAVAILABLE"
            )

    def end_overdue(self) -> int:
        """The drain deadline passed: cancel every request still running; returns how many."""
        self._ending = True
        with self._lock:
            handles = list(self._handles)
        for handle in handles:
            handle.cancel()
        return len(handles)

    @property
    def is_quiescent(self) -> bool:
        """Nothing queued or running in the engine."""
        return self.engine.num_in_flight == 0

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine: requests in flight get timeout_s, then what is left is cancelled. Safe twice."""
        if self._closed:
            return
        self._closed = True
        if self.kv is not None:
            self.kv.close()  # exports released while the engine still runs; the store deregistered
        self.engine.shutdown(timeout_s)
