"""Start, supervise and stop one Dynamo launch (llmkiln.dynamo.cluster): `kiln serve ENGINE --dynamo`.

`DynamoLauncher.start()` wipes the launch's discovery folder, starts llmkiln's OpenAI front on the public port
(llmkiln.dynamo.openai_front: 429/503 + Retry-After, streaming or not), Dynamo's frontend behind it and the N
workers (each in its own session, so a terminal's Ctrl-C reaches only kiln, which stops them in order; each dies
with the launcher: a parent-death signal, and a reaper — llmkiln.serve.reaper — that kills the launch's cgroup or
process groups and removes the discovery folder when the launcher is gone, SIGKILL included), and `wait_ready()`
returns
once the frontend lists the model and N generate instances — a worker registers only after its warmup, so no
request reaches a cold worker. `stop()` sends SIGTERM to every process (workers unregister, finish what is in
flight, exit), SIGKILLs what is still alive after the timeout, and removes the discovery folder: no process and
no discovery file is left; from its first moment the front answers new requests 503 + Retry-After. `serve_forever()` adds the signals and supervision: a worker that dies is restarted
(up to `max_restarts` times), a frontend that dies ends the launch with an error.

Prefill/decode launches also keep the prefill tier's stand-in ready (llmkiln.dynamo.prefill_standin): the
moment supervision finds no prefill worker up — one died, or was killed for hanging — it activates the stand-in,
which registers in the prefill tier and hands every prompt to the decode workers to prefill (counted as
fallbacks there), and tells the front to hold requests that meet the frontend's 503 ("no prefill worker") for the
few hundred milliseconds the registration takes; once a prefill worker has registered again the stand-in is
stopped and a fresh one waits. The bound: a dead prefill worker is covered within one supervision period plus the
registration (0.25–0.35 s measured with the tests' 0.5 s period), a hung one within serve.stall_timeout_s plus
that (docs/serve.md, "Prefill/decode separation").
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from tokenizers import Tokenizer

from llmkiln.atomic import write_text_atomic
from llmkiln.dynamo.cluster import ClusterSpec, merge_overrides
from llmkiln.dynamo.openai_front import OpenAIFront
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.dynamo.worker_options import PREFILL_COMPONENT
from llmkiln.engine_dir import EngineDir, resolve_engine
from llmkiln.errors import BadInput, KilnError
from llmkiln.host.check import check_engine
from llmkiln.host.metrics import parse_exposition
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import KV_LAYOUT_FIELDS
from llmkiln.serve.exit_status import crash_excerpt, describe_exit
from llmkiln.serve.http_checks import prompt_byte_bound
from llmkiln.serve.ports import free_ports, port_free
from llmkiln.serve.reaper import Reaper, die_with_parent

STOP_MARGIN_S = 10.0
LIVENESS_PROBE_S = 1.0  # how often supervise_once asks each worker's status port
LIVENESS_PROBE_TIMEOUT_S = 2.0
STANDIN_HOLD_S = 5.0  # how long the front holds requests the frontend answers 503 while a tier changes hands


class LaunchFailed(KilnError):
    """A process of the launch exited or never became ready; the message carries its last log lines."""


@dataclass
class Proc:
    """One process of the launch and the tail of its log."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    restarts: int = 0
    _reader: threading.Thread | None = None

    def start(self, echo: IO[str] | None, reaper: Reaper | None = None) -> None:
        """Start the process (from the thread that lives as long as the launch: it dies with that thread, and
        with the launcher through `reaper`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = die_with_parent(self.command)
        self.popen = subprocess.Popen(
            reaper.wrap(argv) if reaper is not None else argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if reaper is not None:
            reaper.watch_group(self.popen.pid)
        self._reader = threading.Thread(target=self._read, args=(echo,), name=f"{self.name}-log", daemon=True)
        self._reader.start()

    def _read(self, echo: IO[str] | None) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as log:
            for raw in iter(self.popen.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                self.lines.append(line.rstrip("\n"))
                log.write(line)
                log.flush()
                if echo is not None:
                    echo.write(f"[{self.name}] {line}")
                    echo.flush()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> bool:
        if self.popen is None:
            return True
        try:
            self.popen.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        if self._reader is not None:
            self._reader.join(timeout=5)
        return True

    def tail(self, n: int = 25) -> str:
        return "\n".join(list(self.lines)[-n:])


class DynamoLauncher:
    """One launch: a frontend and N workers (see the module docstring)."""

    def __init__(
        self,
        spec: ClusterSpec,
        echo: IO[str] | None = None,
        max_restarts: int = 3,
        owns_state: bool = False,
    ) -> None:
        spec.check()
        self.spec = spec
        # the state folder is the launch's own temp folder: removed with everything else if the launcher is
        # killed (kept, with its logs, when the launch fails: keep_logs)
        self.owns_state = owns_state
        self.echo = echo
        self.max_restarts = max_restarts
        self.frontend = Proc("frontend", spec.frontend_command(), spec.env(), spec.log_dir / "frontend.log")
        self.workers = [
            Proc(
                f"worker-{i}",
                spec.worker_commandline(i),
                spec.worker_env(i),
                spec.log_dir / f"worker-{i}.log",
            )
            for i in range(spec.workers)
        ]
        self.stopping = threading.Event()
        self.front: OpenAIFront | None = None
        self._last_live: dict[int, float] = {}  # worker index -> when its status port last answered healthily
        self._next_probe = 0.0
        self._next_frontend_probe = 0.0
        self._frontend_live: float | None = (
            None  # the last answer of the frontend's /health (None: not up yet)
        )
        self.reaper: Reaper | None = None  # kills the launch's processes if the launcher dies
        # prefill/decode: the prefill tier's stand-in, started with the launch and waiting for its trigger
        self._standin_generation = 0
        self.standin: Proc | None = self._standin_proc() if spec.disaggregated else None
        self.standin_active_since: float | None = None  # when it was activated (None: waiting)
        self._retired: list[Proc] = []  # stand-ins deactivated, unregistering and exiting
        self._prefill_registration: dict[str, Any] | None = None  # what the prefill workers registered
        # the model cards of dead prefill workers, removed once another prefill instance is registered (see
        # _cover_prefill_tier)
        self._pending_cards: list[Path] = []
        self.tier_log: list[str] = []  # what happened to the prefill tier's cover, in order
        self._standin_live: float | None = None  # when the active stand-in's status port last answered
        self._next_standin_probe = 0.0

    @property
    def procs(self) -> list[Proc]:
        standins = [self.standin] if self.standin is not None else []
        return [self.frontend, *self.workers, *standins, *self._retired]

    @property
    def url(self) -> str:
        return self.spec.url

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        s = self.spec
        ports = [("--http-port", s.http_port)] + [("worker status port", p) for p in s.status_ports]
        if s.standin_status_port:
            ports.append(("prefill stand-in status port", s.standin_status_port))
        if s.frontend_port:
            ports.append(("frontend port", s.frontend_port))
        for what, port in ports:
            if not port_free(s.host, port):
                raise BadInput(f"{what} {port}: the port is already in use on {s.host}; pick another port")
        # Stale discovery state (a crashed launch's workers) would be routed to: start from an empty folder.
        shutil.rmtree(s.discovery_dir, ignore_errors=True)
        s.discovery_dir.mkdir(parents=True)
        s.log_dir.mkdir(parents=True, exist_ok=True)
        s.instance_file(0).parent.mkdir(parents=True, exist_ok=True)
        self.reaper = Reaper("dynamo")
        self.reaper.start()
        self.reaper.remove_tree(s.discovery_dir)
        if self.owns_state:
            self.reaper.remove_tree(s.state_dir)
        if s.frontend_port:
            folder = EngineDir(s.engine)
            tok_file = folder.tokenizer_file()
            tokenizer = Tokenizer.from_file(str(tok_file)) if tok_file is not None else None
            bound = (
                prompt_byte_bound(tokenizer.get_vocab(), folder.recipe().limits.max_input_len)
                if tokenizer is not None
                else None
            )
            model = s.served_model_name or folder.recipe().serve.model_name
            self.front = OpenAIFront(
                s.host,
                s.http_port,
                s.frontend_address,
                tokenizer,
                bound,
                retry_no_worker=s.disaggregated,
                models=(model,),
            )
            try:
                self.front.start()
            except OSError as exc:
                raise BadInput(f"--http-port {s.http_port}: cannot listen on {s.host} ({exc})") from None
        for proc in self.procs:
            proc.start(self.echo, self.reaper)

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Block until the frontend serves the model with every worker registered; returns seconds waited."""
        t0 = time.monotonic()
        while True:
            for proc in self.procs:
                if not proc.alive():
                    raise LaunchFailed(self._failure(proc, "exited before the launch was ready"))
            if self.ready_instances() >= self.spec.workers:
                now = time.monotonic()
                self._last_live = {
                    i: now for i in range(len(self.workers))
                }  # registered: up, judged from now
                self._frontend_live = now
                if self.standin is not None:
                    self._prefill_registration = self._read_prefill_registration(self.spec.prefill_indices())
                return now - t0
            if time.monotonic() - t0 > timeout_s:
                raise LaunchFailed(
                    f"not ready after {timeout_s:.0f} s ({self.ready_instances()} of {self.spec.workers} workers "
                    f"registered); logs in {self.spec.log_dir}"
                )
            if self.stopping.wait(0.25):
                raise LaunchFailed("stopped before the launch was ready")

    def ready_instances(self) -> int:
        """Generate instances the frontend knows, once it also lists a model (0 while it does not answer)."""
        try:
            models = _get_json(f"{self.url}/models")
            health = _get_json(self.url.removesuffix("/v1") + "/health")
        except (urllib.error.URLError, OSError, ValueError):
            return 0
        if not models.get("data"):
            return 0
        return sum(1 for i in health.get("instances", []) if i.get("endpoint") == "generate")

    # -- observe ---------------------------------------------------------------------------------------------
    def worker_metrics(self, index: int, timeout_s: float = 5.0) -> dict[str, float]:
        """llmkiln_* metrics of one worker (its status port /metrics), names without the prefix."""
        with urllib.request.urlopen(f"{self.spec.status_url(index)}/metrics", timeout=timeout_s) as r:
            return parse_exposition(r.read().decode("utf-8"))

    # -- stop ------------------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Some process of the launch was started (so there are logs)."""
        return any(p.popen is not None for p in self.procs)

    def keep_logs(self) -> None:
        """The launch failed: its state folder (the logs the error names) outlives the stop."""
        if self.reaper is not None and self.owns_state:
            self.reaper.keep_tree(self.spec.state_dir)

    def stop(self, timeout_s: float | None = None) -> dict[str, int | None]:
        """SIGTERM everything, wait (grace period + drain + margin), SIGKILL stragglers, remove discovery files.
        Returns each process's exit code."""
        self.stopping.set()
        s = self.spec
        if self.front is not None:
            self.front.draining = True  # new requests: 503 + Retry-After from now on
        if timeout_s is None:
            timeout_s = s.options.grace_period_s + s.drain_timeout_s + STOP_MARGIN_S
        for proc in self.procs:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            if not proc.wait(deadline - time.monotonic()):
                proc.lines.append(f"llmkiln: {proc.name} did not stop within {timeout_s:.0f} s: killed")
                proc.signal(signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(s.discovery_dir, ignore_errors=True)
        if self.front is not None:
            self.front.stop()
            self.front = None
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None
        return {p.name: p.returncode() for p in self.procs}

    def __enter__(self) -> DynamoLauncher:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- supervise -------------------------------------------------------------------------------------------
    def supervise_once(self) -> None:
        """Restart workers that died (LaunchFailed once one died too often, or when the frontend died)."""
        if self.stopping.is_set():
            return
        if not self.frontend.alive():
            raise LaunchFailed(self._failure(self.frontend, "exited"))
        self._check_frontend()
        self._kill_stuck_workers()
        if self.standin is not None:
            self._cover_prefill_tier()
        for proc in self.workers:
            if proc.alive() or self.stopping.is_set():
                continue
            if proc.restarts >= self.max_restarts:
                raise LaunchFailed(self._failure(proc, f"exited {proc.restarts + 1} times"))
            self._forget_instance(self.workers.index(proc))
            proc.restarts += 1
            proc.lines.append(f"llmkiln: {proc.name} exited with code {proc.returncode()}: restarting it")
            if self.echo is not None:
                self.echo.write(f"llmkiln: {proc.name} exited with code {proc.returncode()}: restarting it\n")
            proc.start(self.echo, self.reaper)

    def _check_frontend(self) -> None:
        """Liveness of Dynamo's frontend: its own /health must answer; one that has not for longer than the stall
        bound (a stopped or stuck process) is SIGKILLed and the launch fails (LaunchFailed: `kiln serve` exits 1
        and stops every process), instead of staying up with requests timing out behind it."""
        now = time.monotonic()
        if now < self._next_frontend_probe:
            return
        self._next_frontend_probe = now + LIVENESS_PROBE_S
        try:
            with urllib.request.urlopen(
                f"http://{self.spec.frontend_address}/health", timeout=LIVENESS_PROBE_TIMEOUT_S
            ) as r:
                r.read()
            self._frontend_live = now
            return
        except urllib.error.HTTPError:  # it answered (e.g. 503 while a worker is missing): alive
            self._frontend_live = now
            return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        bound = self.spec.stall_timeout_s
        if self._frontend_live is not None and now - self._frontend_live > bound:
            silent = now - self._frontend_live
            msg = f"llmkiln: {self.frontend.name} is stuck (its /health has not answered for {silent:.0f} s; "
            msg += f"serve.stall_timeout_s = {bound:g}): killed, the launch stops"
            self.frontend.lines.append(msg)
            if self.echo is not None:
                self.echo.write(msg + "\n")
            self.frontend.signal(signal.SIGKILL)
            self.frontend.wait(5.0)
            raise LaunchFailed(self._failure(self.frontend, "hung"))

    def _kill_stuck_workers(self) -> None:
        """Liveness: a worker whose status port does not answer (a stopped or stuck process), or whose engine made
        no step with requests in flight, for longer than the stall bound is SIGKILLed; supervise_once restarts it
        and the frontend moves its streams to a live worker (--migration-limit)."""
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + LIVENESS_PROBE_S
        bound = self.spec.stall_timeout_s
        for i, proc in enumerate(self.workers):
            if not proc.alive():
                self._last_live.pop(i, None)
                continue
            try:
                stalled = self.worker_metrics(i, timeout_s=LIVENESS_PROBE_TIMEOUT_S).get(
                    "engine_stalled_seconds", 0.0
                )
                why = None if stalled <= bound else f"its engine made no step for {stalled:.0f} s"
            except (urllib.error.URLError, OSError, ValueError):
                stalled, why = 0.0, "its status port does not answer"
            if why is None:
                self._last_live[i] = now
                continue
            if i not in self._last_live:
                continue  # not up yet since it (re)started: a start is bounded by wait_ready, not judged here
            if stalled > bound or now - self._last_live[i] > bound:
                msg = f"llmkiln: {proc.name} is stuck ({why}; serve.stall_timeout_s = {bound:g}): killed"
                proc.lines.append(msg)
                if self.echo is not None:
                    self.echo.write(msg + "\n")
                proc.signal(signal.SIGKILL)
                proc.wait(5.0)
                self._forget_instance(i)
                self._last_live.pop(i, None)

    # -- the prefill tier's stand-in -------------------------------------------------------------------------
    def _standin_proc(self) -> Proc:
        gen = self._standin_generation
        return Proc(
            "prefill-standin",
            self.spec.standin_commandline(),
            self.spec.standin_env(gen),
            self.spec.log_dir / "prefill-standin.log",
        )

    def _note(self, msg: str) -> None:
        self.tier_log.append(msg)
        if self.echo is not None:
            self.echo.write(msg + "\n")

    def _replace_standin(self) -> None:
        """A fresh stand-in, waiting for its own trigger file."""
        self._standin_generation += 1
        self.standin = self._standin_proc()
        self.standin.start(self.echo, self.reaper)

    def _cover_prefill_tier(self) -> None:
        """Activate the stand-in when no prefill worker is up; withdraw it once one is registered again (module
        docstring). The tier's worker set must never empty meanwhile: Dynamo 1.6.1's frontend drops a worker set
        whose last model card goes, and a set formed again within a second or so may route with a discovery
        snapshot frozen at the drop (measured: "no endpoints available" for a restarted worker, seconds on end). So
        a dead prefill worker's model card stays (its instance goes at once: nothing is routed to it) until the
        stand-in's card is in the set, and the stand-in's goes only once a worker's is."""
        assert self.standin is not None
        self._retired = [p for p in self._retired if p.alive()]
        now = time.monotonic()
        if self.standin_active_since is not None and self.standin.alive() and self._standin_stuck(now):
            bound = self.spec.stall_timeout_s
            self._note(f"llmkiln: the prefill stand-in is stuck (its status port does not answer; "
                       f"serve.stall_timeout_s = {bound:g}): killed")  # fmt: skip
            self.standin.signal(signal.SIGKILL)
            self.standin.wait(5.0)
        # it died: forget its registration, start another (activated below if due)
        if not self.standin.alive():
            self._note(f"llmkiln: the prefill stand-in exited ({describe_exit(self.standin.returncode())}): "
                       "restarting it")  # fmt: skip
            # its instance goes at once, its card once another prefill instance holds the set (as a worker's)
            self._forget_record(self.spec.standin_instance_file(), keep_cards=True)
            self.standin_active_since = None
            self._replace_standin()
        prefill = self.spec.prefill_indices()
        if self.standin_active_since is None and not self._pending_cards:
            if all(self.workers[i].alive() for i in prefill):
                return  # the usual case: the tier is whole, nothing to ask
        registered = self._registered(PREFILL_COMPONENT)
        if registered is None:
            return  # the frontend did not answer: decide at the next probe
        if self._pending_cards and registered:  # another prefill instance holds the set: the dead cards go
            for card in self._pending_cards:
                card.unlink(missing_ok=True)
            self._pending_cards = []
        workers_up = self._prefill_workers_up(prefill, registered)
        if self.standin_active_since is None:
            if workers_up:
                return  # another prefill worker serves
            # a stand-in still unregistering holds the status port the next one needs
            for old in self._retired:
                old.signal(signal.SIGKILL)
                old.wait(2.0)
            trigger = self.spec.standin_trigger(self._standin_generation)
            trigger.parent.mkdir(parents=True, exist_ok=True)
            # the prefill workers' registration, which the stand-in's must equal: the frontend keeps the first
            # configuration of a tier and rejects a worker registering another one
            write_text_atomic(trigger, json.dumps(self._prefill_registration or {}))
            self.standin_active_since = now
            self._standin_live = None  # judged once its status port has answered
            if self.front is not None:
                self.front.hold_unavailable(STANDIN_HOLD_S)
            self._note(
                "llmkiln: no prefill worker is up: the prefill stand-in hands every prompt to the decode workers "
                "(prefilled there, counted in llmkiln_kv_transfer_fallbacks_total) until one is back"
            )
            return
        if not workers_up:
            return  # still covering
        covered = now - self.standin_active_since
        self.standin.signal(
            signal.SIGTERM
        )  # it unregisters at once (nothing is ever in flight there) and exits
        self._retired.append(self.standin)
        self._forget_record(self.spec.standin_instance_file())  # its card too: the worker's holds the set
        self.standin_active_since = None
        if self.front is not None:
            self.front.hold_unavailable(STANDIN_HOLD_S)  # a request routed to it as it left is sent again
        self._replace_standin()
        self._note(
            f"llmkiln: a prefill worker is registered again after {covered:.1f} s: the prefill stand-in left"
        )

    def _standin_stuck(self, now: float) -> bool:
        """Liveness of the active stand-in, as a worker's: its status port silent for longer than the stall bound
        since it last answered (not judged before its first answer: the registration is under way)."""
        if now < self._next_standin_probe:
            return False
        self._next_standin_probe = now + LIVENESS_PROBE_S
        url = f"{self.spec.standin_status_url()}/health"
        try:
            with urllib.request.urlopen(url, timeout=LIVENESS_PROBE_TIMEOUT_S) as r:
                r.read()
            answered = True
        except urllib.error.HTTPError:
            answered = True  # it answered (not healthy yet, say): the process runs
        except (urllib.error.URLError, OSError):
            answered = False
        if answered:
            self._standin_live = now
            return False
        return self._standin_live is not None and now - self._standin_live > self.spec.stall_timeout_s

    def _read_prefill_registration(self, prefill: list[int]) -> dict[str, Any] | None:
        """The runtime configuration a prefill worker registered (its model card in discovery), or None."""
        for i in prefill:
            instance_id = _instance_id(self.spec.instance_file(i))
            if instance_id is None:
                continue
            tag = format(instance_id, "x")
            for card in (self.spec.discovery_dir / "v1" / "mdc").glob(f"*%2F{PREFILL_COMPONENT}%2F*%2F{tag}"):
                try:
                    runtime = json.loads(card.read_text())["card_json"]["runtime_config"]
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if isinstance(runtime, dict):
                    return runtime
        return None

    def _prefill_workers_up(self, prefill: list[int], registered: set[int]) -> bool:
        """Some prefill worker is alive and `registered` (the frontend's prefill instances) lists it."""
        for i in prefill:
            if not self.workers[i].alive():
                continue
            instance_id = _instance_id(self.spec.instance_file(i))  # None while (re)starting: no instance yet
            if instance_id is not None and instance_id in registered:
                return True
        return False

    def _registered(self, component: str) -> set[int] | None:
        """Instance ids of the generate endpoints of `component` that the frontend's /health lists."""
        url = f"http://{self.spec.frontend_address}/health"
        try:
            with urllib.request.urlopen(url, timeout=LIVENESS_PROBE_TIMEOUT_S) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:  # 503 while a tier is missing: the body still lists the rest
            body = exc.read()
        except (urllib.error.URLError, OSError):
            return None
        try:
            instances = json.loads(body).get("instances", [])
        except (ValueError, AttributeError):
            return None
        return {
            int(i["instance_id"])
            for i in instances
            if isinstance(i, dict) and i.get("component") == component and i.get("endpoint") == "generate"
        }

    def _forget_instance(self, index: int) -> int:
        """Remove a dead worker's registrations from file discovery at once (a SIGKILLed process cannot remove
        its own): the frontend then stops routing to it — no request is sent to a dead instance and answered 500;
        with no worker of a tier left it answers 503 until the restarted one registers. A prefill worker's model
        card stays while the stand-in arrives (_cover_prefill_tier). Returns files removed."""
        covered = self.standin is not None and self.spec.worker_role(index) is WorkerRole.PREFILL
        return self._forget_record(self.spec.instance_file(index), keep_cards=covered)

    def _forget_record(self, record: Path, keep_cards: bool = False) -> int:
        """The registrations of the instance `record` names, removed from discovery (see _forget_instance);
        `keep_cards`: its model cards are left for _cover_prefill_tier to remove."""
        instance_id = _instance_id(record)
        if instance_id is None:
            return 0
        record.unlink(missing_ok=True)
        tag = format(instance_id, "x")
        removed = 0
        for path in list(self.spec.discovery_dir.rglob("*")):
            if not path.is_file():
                continue
            mine = path.name.endswith(f"%2F{tag}")
            if not mine:  # KV event sources name their worker inside
                try:
                    worker = json.loads(path.read_text()).get("metadata", {}).get("worker", {})
                    mine = isinstance(worker, dict) and worker.get("worker_id") == instance_id
                except (OSError, ValueError, AttributeError):
                    mine = False
            if mine and keep_cards and path.parent.name == "mdc":
                self._pending_cards.append(path)
            elif mine:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def _failure(self, proc: Proc, what: str) -> str:
        lines = list(proc.lines)
        crash = crash_excerpt(lines)  # faulthandler's report of a native crash, and the step it was in
        return (
            f"{proc.name} {what} ({describe_exit(proc.returncode())}).\n"
            + (f"{crash}\n" if crash else "")
            + f"Last lines (full log: {proc.log_path}):\n{proc.tail()}"
        )


def serve_forever(
    launcher: DynamoLauncher, on_ready: Callable[[DynamoLauncher, float], None] | None = None
) -> int:
    """Run the launch until SIGINT/SIGTERM; returns 0 after a requested stop, raises LaunchFailed otherwise."""

    def request_stop(signum: int, _frame: object) -> None:
        launcher.stopping.set()

    old = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        launcher.start()
        try:
            waited = launcher.wait_ready()
        except LaunchFailed:
            if launcher.stopping.is_set():  # interrupted while loading: a requested stop
                return 0
            raise
        if on_ready is not None:
            on_ready(launcher, waited)
        while not launcher.stopping.wait(0.5):
            launcher.supervise_once()
        return 0
    except BaseException:
        launcher.keep_logs()
        raise
    finally:
        launcher.stop()
        for s, h in old.items():
            signal.signal(s, h)


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=2) as r:
        data = json.loads(r.read())
    return data if isinstance(data, dict) else {}


def _instance_id(record: Path) -> int | None:
    """The Dynamo instance id a process wrote in its instance file (registration.record_instance), or None."""
    try:
        return int(json.loads(record.read_text())["instance_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def make_spec(engine: str | Path, opts: DynamoOptions, state_dir: Path) -> ClusterSpec:
    """The launch for an engine folder (or a recipe name under the engines root), with free status ports."""
    folder = resolve_engine(engine, opts.engines_root).require()
    if folder.hf_config_file() is None or not folder.chat_template():
        raise BadInput(
            f"{folder.path}: the Dynamo frontend needs config.json and a chat template in tokenizer_config.json; "
            f"this engine was built before they were part of the engine folder: rebuild it with "
            f"`kiln build {folder.recipe().name} --force`"
        )
    serve = folder.recipe().serve
    if opts.disaggregated:
        if not folder.recipe(opts.overrides or None).kv_cache.prefix_reuse:
            raise BadInput(
                f"{folder.path}: prefill/decode separation moves the prompt's KV through the prefix store: the "
                "recipe has kv_cache.prefix_reuse off"
            )
        if opts.prefill_overrides:  # validated here (exit 2 naming the field), not in a worker's log
            try:
                prefill = folder.recipe(merge_overrides(opts.overrides, opts.prefill_overrides))
            except BadInput as exc:
                raise BadInput(f"prefill overrides (--prefill-set): {exc}") from None
            decode = folder.recipe(opts.overrides or None)
            for section, name in KV_LAYOUT_FIELDS:  # the KV moves between the tiers as bytes
                mine, theirs = (
                    getattr(getattr(prefill, section), name),
                    getattr(getattr(decode, section), name),
                )
                if mine != theirs:
                    raise BadInput(
                        f"prefill overrides (--prefill-set): {section}.{name} {mine!r} differs from the decode "
                        f"tier's {theirs!r}: the prefill and decode workers must share the KV layout (set it with "
                        "--set for both, or not at all)"
                    )
    resolved = replace(
        opts,
        http_port=serve.http_port if opts.http_port is None else opts.http_port,
        drain_timeout_s=float(serve.exit_timeout_s if opts.drain_timeout_s is None else opts.drain_timeout_s),
    )
    ports = status_ports(opts.num_workers + (1 if resolved.disaggregated else 0), opts.host)
    return ClusterSpec(
        engine=folder.path,
        state_dir=state_dir,
        options=resolved,
        stall_timeout_s=serve.stall_timeout_s,
        status_ports=tuple(ports[: opts.num_workers]),
        standin_status_port=ports[-1] if resolved.disaggregated else 0,
        frontend_port=free_ports(1, opts.host)[0],
    )


# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit integer: the status ports must be below 32768, where the
# OS's ephemeral ports (what free_ports hands out) usually are not.
STATUS_PORT_RANGE = (20000, 32767)


def status_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports below 32768 that are free now, from a random start in STATUS_PORT_RANGE."""
    lo, hi = STATUS_PORT_RANGE
    start = random.randrange(lo, hi)
    out: list[int] = []
    for offset in range(hi - lo):
        port = lo + (start - lo + offset) % (hi - lo)
        if port_free(host, port):
            out.append(port)
            if len(out) == n:
                return out
    raise KilnError(f"no {n} free ports in {lo}-{hi} on {host} for the workers' status servers")


def serve_dynamo(
    engine: str | Path,
    opts: DynamoOptions,
    echo: IO[str] | None = None,
    on_ready: Callable[[DynamoLauncher, float], None] | None = None,
) -> int:
    """Serve `engine` through Dynamo until SIGINT/SIGTERM. A temp state folder is removed after a clean stop
    and after a launch refused before it started a process (kept, with the logs, after any other failure). The engine is checked first, as `kiln serve` checks it (a corrupted
    engine is never served: IntegrityError, exit 1); each worker's host checks it again before it loads."""
    check_engine(engine, opts.engines_root)
    own = opts.state_dir is None
    state = Path(tempfile.mkdtemp(prefix="llmkiln-dynamo-")) if own else Path(opts.state_dir or ".")
    launcher: DynamoLauncher | None = None
    try:
        launcher = DynamoLauncher(make_spec(engine, opts, state), echo=echo, owns_state=own)
        code = serve_forever(launcher, on_ready)
    except BaseException:
        if own and (launcher is None or not launcher.started):  # refused (a busy port, ...): no logs to keep
            shutil.rmtree(state, ignore_errors=True)
        raise
    if own:
        shutil.rmtree(state, ignore_errors=True)
    return code
