"""The process layout of one Dynamo launch: a frontend and N llmkiln workers for one engine, their command lines
and environment. Pure data (llmkiln.dynamo.launcher runs it); nothing here imports `dynamo`.

One host needs no etcd or NATS: discovery is a folder (`DYN_DISCOVERY_BACKEND=file`, `DYN_FILE_KV`) that is
private to the launch and wiped when it starts (a crashed worker's keys would otherwise stay and be routed to),
requests travel over TCP and KV events over ZMQ. Every address is `host` (127.0.0.1 unless `--host` says
otherwise): the HTTP frontend, the TCP request plane, the response streams, the workers' status ports.
NOTE: Dynamo 1.6.1's ZMQ PUB sockets (KV events, active-sequence events) bind 0.0.0.0 whatever the advertised
address; only the address in discovery follows DYN_EVENT_PLANE_HOST (docs/serve.md, security).

What to launch is the user's `DynamoOptions` (llmkiln.dynamo.options: checked there, once); `ClusterSpec` adds
what the launch resolved (the engine folder, the state folder, ports) and derives each worker's
`WorkerOptions` (llmkiln.dynamo.worker_options), whose `to_argv()` is the worker's command line.

Each worker's onnxruntime intra-op threads are capped to its share of the cores (cores // workers, at least
one), so N workers on a few cores do not oversubscribe them.

Prefill/decode separation (`prefill_workers` P and `decode_workers` D): workers 0..P-1 are prefill workers,
P..P+D-1 decode workers (LaunchOptions.worker_role), each with its core share. Both roles get the launch's KV
transfer options (prefill workers hand prompts with a short uncached part to the decode worker, which caps its
prefill runs to the same `max_local_prefill_tokens`); prefill workers get the recipe fields of
`prefill_overrides` over `overrides`. `decode_first` (one CPU host): decode workers get every core and no
spinning, prefill workers their share and idle compute priority, so decode steps, the front door and the KV
transfers preempt the prefill tier's compute; unless the options say, it is on where each worker's core share is
small (decode_first_choice: the measured 2-core case).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.dynamo.options import DynamoOptions, field_default
from llmkiln.dynamo.worker_options import NAMESPACE, WORKER_MODULE, WorkerOptions
from llmkiln.host.engine_host import DEFAULT_STALL_TIMEOUT_S
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.profile import PROFILE_ENV

DISCOVERY_DIR = "discovery"
LOG_DIR = "logs"


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# A launch of prefill/decode separation on one host puts the decode tier first when each worker's core share is
# at most this many cores. 2 cores, 1 prefill + 1 decode worker against 2 aggregated ones, short requests at c=8:
# equal shares TTFT p95 1.16x (bench/results/pd: the target, <= 1.0x, missed); decode tier first 0.40x and
# ITL p99 0.08x (bench/results/pd-192), 0.23x / 0.11x as the default on the Xeon (bench/results/pd-default).
# On bigger shares the front door's and the transfers' cycles are a small part of a worker's cores: not measured
# here, so such launches keep equal shares unless --decode-first is given.
DECODE_FIRST_MAX_CORES_PER_WORKER = 2


def decode_first_choice(options: DynamoOptions, cores: int) -> tuple[bool, str]:
    """Whether a launch runs the decode tier first, and why (printed when the launch is ready)."""
    if not options.disaggregated:
        return False, "aggregated workers"
    if options.decode_first is not None:
        return options.decode_first, "--decode-first" if options.decode_first else "--no-decode-first"
    if options.threads_per_worker:
        return False, "--threads-per-worker sets every worker's threads"
    if not sys.platform.startswith("linux"):
        return False, "idle compute priority (SCHED_IDLE) is Linux only"
    share = cores // options.num_workers
    if share <= DECODE_FIRST_MAX_CORES_PER_WORKER:
        return True, (
            f"{cores} core(s) for {options.num_workers} workers: the tiers share the cores with the front door "
            "(--no-decode-first: equal shares)"
        )
    return False, f"{cores} cores for {options.num_workers} workers: a core share of {share} each"


def merge_overrides(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Nested recipe overrides `top` over `base`, merged one section deep (copies; neither is changed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


INSTANCE_FILE_ENV = "LLMKILN_INSTANCE_FILE"  # a worker writes {"instance_id": ...} there once started
STANDIN_TRIGGER_ENV = "LLMKILN_STANDIN_TRIGGER"  # the prefill stand-in registers once this file exists
STANDIN_MODULE = "llmkiln.dynamo.prefill_standin"


@dataclass(frozen=True)
class ClusterSpec:
    """One launch: the user's options (`options`, with http_port resolved by make_spec), where its state lives,
    and the ports and names the launch picked."""

    engine: Path
    state_dir: Path  # the launch's folder: discovery/ (wiped at start) and logs/
    options: DynamoOptions = field(default_factory=DynamoOptions)
    status_ports: tuple[int, ...] = ()  # one per worker: /health and /metrics (llmkiln_* and dynamo_*)
    # the prefill stand-in's (prefill/decode launches): its model card must be the prefill workers' to the byte,
    # and a worker's card lists its files as served by its status server
    standin_status_port: int = 0
    # Dynamo's frontend, behind llmkiln's OpenAI front (llmkiln.dynamo.openai_front) on loopback; 0: no front,
    # the frontend takes the public http_port
    frontend_port: int = 0
    stall_timeout_s: float = (
        DEFAULT_STALL_TIMEOUT_S  # the recipe's serve.stall_timeout_s: stalled workers are killed
    )
    served_model_name: str | None = None  # default: the recipe's serve.model_name
    namespace: str = NAMESPACE
    kv_events: bool = True  # workers publish their block stores' events (needed by router_mode kv)
    # The KV router's default cost adds each worker's resident KV blocks of requests in flight (a GPU memory-
    # pressure signal). An llmkiln worker keeps a request's KV in its own preallocated slot, and a prefix miss
    # costs a whole prefill on a CPU, so counting those blocks as load pushes requests away from the worker that
    # holds their prefix under a burst (measured: kv-2w hit rate 0.84 with it, 0.96 without, = one worker holding
    # every prompt; bench/results/scaleout). Off by default; load is still balanced by prefill tokens in flight.
    track_active_blocks: bool = False
    worker_command: tuple[str, ...] = (sys.executable, "-m", WORKER_MODULE)
    python: str = sys.executable
    log_level: str = "info"

    def check(self) -> None:
        """What the launch resolved (the options checked themselves when made)."""
        if self.options.http_port is None:
            raise ValueError("ClusterSpec.options.http_port is unresolved (make_spec sets it)")
        if self.frontend_port and self.frontend_port == self.http_port:
            raise ValueError("the frontend port must differ from the public --http-port")
        if len(self.status_ports) != self.workers:
            raise ValueError(f"{self.workers} workers need as many status ports, got {self.status_ports}")

    # -- the layout ------------------------------------------------------------------------------------------
    @property
    def workers(self) -> int:
        return self.options.num_workers

    @property
    def disaggregated(self) -> bool:
        return self.options.disaggregated

    def worker_role(self, index: int) -> WorkerRole:
        return self.options.worker_role(index)

    def prefill_indices(self) -> list[int]:
        """The indices of the prefill workers (none in an aggregated launch)."""
        return [i for i in range(self.workers) if self.worker_role(i) is WorkerRole.PREFILL]

    @property
    def host(self) -> str:
        return self.options.host

    @property
    def http_port(self) -> int:
        """The public port (llmkiln's OpenAI front, or the frontend itself without one)."""
        assert self.options.http_port is not None, "unresolved: see check()"
        return self.options.http_port

    @property
    def threads(self) -> int:
        """Intra-op threads of each worker (decode_first: of each prefill worker)."""
        return self.options.threads_per_worker or max(1, available_cores() // self.workers)

    @property
    def decode_first(self) -> bool:
        """The decode tier first (the options' --decode-first / --no-decode-first, else decode_first_choice)."""
        return decode_first_choice(self.options, available_cores())[0]

    @property
    def decode_first_why(self) -> str:
        return decode_first_choice(self.options, available_cores())[1]

    def worker_threads(self, index: int) -> int:
        """Intra-op threads of worker `index`: its core share; with decode_first a decode worker's are every core."""
        if self.decode_first and self.worker_role(index) is WorkerRole.DECODE:
            return available_cores()
        return self.threads

    @property
    def discovery_dir(self) -> Path:
        return self.state_dir / DISCOVERY_DIR

    @property
    def log_dir(self) -> Path:
        return self.state_dir / LOG_DIR

    @property
    def url_host(self) -> str:
        """The host as a URL names it (an IPv6 address in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def url(self) -> str:
        """The OpenAI base URL (…/v1)."""
        return f"http://{self.url_host}:{self.http_port}/v1"

    @property
    def frontend_address(self) -> str:
        """host:port of Dynamo's own frontend (behind the front when frontend_port is set)."""
        return f"{self.url_host}:{self.frontend_port or self.http_port}"

    # -- environment and commands ----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment every process of the launch gets (file discovery, addresses, logging)."""
        env = dict(os.environ)
        env.update(
            {
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.discovery_dir),
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_EVENT_PLANE": "zmq",
                "DYN_TCP_RPC_HOST": self.host,
                "DYN_TCP_RESPONSE_STREAM_HOST": self.host,
                "DYN_EVENT_PLANE_HOST": self.host,
                "DYN_SYSTEM_HOST": self.host,
                "DYN_NAMESPACE": self.namespace,
                "DYN_LOG": self.log_level,
                "DYN_SDK_DISABLE_ANSI_LOGGING": "1",
                "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": f"{self.options.grace_period_s:g}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.options.extra_env)
        return env

    def frontend_command(self) -> list[str]:
        router_mode = self.options.router_mode
        cmd = [
            self.python,
            "-m",
            "dynamo.frontend",
            "--http-host",
            self.host,
            "--http-port",
            str(self.frontend_port or self.http_port),
            "--namespace",
            self.namespace,
            "--router-mode",
            router_mode,
            "--migration-limit",
            str(self.options.migration_limit),
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "zmq",
        ]
        if router_mode == "kv" and not self.kv_events:
            cmd.append("--no-router-kv-events")  # route from the router's own decisions
        if router_mode == "kv" and not self.track_active_blocks:
            cmd.append("--no-router-track-active-blocks")
        return [*cmd, *self.options.frontend_args]

    def instance_file(self, index: int) -> Path:
        """Where worker `index` records its Dynamo instance id once registered (INSTANCE_FILE_ENV): what the
        launcher removes from discovery when that worker dies, so the frontend stops routing to it at once."""
        return self.state_dir / "instances" / f"worker-{index}.json"

    def worker_env(self, index: int) -> dict[str, str]:
        env = self.env()
        env.update(
            {
                INSTANCE_FILE_ENV: str(self.instance_file(index)),
                "DYN_SYSTEM_ENABLED": "true",
                "DYN_SYSTEM_PORT": str(self.status_ports[index]),
                # /health follows the generate endpoint's canary checks, not just the process being up
                "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
            }
        )
        if self.options.profile_dir is not None:
            env[PROFILE_ENV] = str(self.profile_path(index))
        return env

    @property
    def profile_dir(self) -> Path | None:
        return self.options.profile_dir

    def profile_path(self, index: int) -> Path:
        """Where worker `index` writes its step profile (with profile_dir set)."""
        assert self.options.profile_dir is not None
        return self.options.profile_dir / f"worker-{index}.jsonl"

    def worker_options(self, index: int) -> WorkerOptions:
        """Worker `index`'s options: its role and core share, the launch's KV transfer options (a prefill worker's
        hand-off threshold is a decode worker's prefill-run cap), its recipe overrides; with decode_first, idle
        compute priority on the prefill tier and no spinning on the decode tier."""
        o = self.options
        role = self.worker_role(index)
        drain = self.drain_timeout_s
        return WorkerOptions(
            engine=self.engine,
            served_model_name=self.served_model_name,
            namespace=self.namespace,
            threads=self.worker_threads(index),
            overrides=self.worker_overrides(index),
            kv_events=self.kv_events,
            role=role,
            kv=o.kv,
            compute_priority="idle" if self.decode_first and role is WorkerRole.PREFILL else "normal",
            spinning=not (self.decode_first and role is WorkerRole.DECODE),
            drain_timeout_s=drain,
        )

    @property
    def drain_timeout_s(self) -> float:
        """How long a stopping worker lets its requests finish (the options', else the worker's default)."""
        o = self.options.drain_timeout_s
        return float(field_default(WorkerOptions, "drain_timeout_s")) if o is None else o

    def worker_args(self, index: int = 0) -> list[str]:
        return self.worker_options(index).to_argv()

    def worker_overrides(self, index: int) -> dict[str, Any]:
        """The recipe overrides of worker `index`: `overrides`, with `prefill_overrides` on top for prefill workers
        (merged one section deep)."""
        top = self.options.prefill_overrides if self.worker_role(index) is WorkerRole.PREFILL else {}
        return merge_overrides(self.options.overrides, top)

    def worker_commandline(self, index: int = 0) -> list[str]:
        return [*self.worker_command, *self.worker_args(index)]

    # -- the prefill tier's stand-in (llmkiln.dynamo.prefill_standin) ---------------------------------------
    def standin_commandline(self) -> list[str]:
        """The stand-in's command: the first prefill worker's arguments, to the stand-in module."""
        return [self.python, "-m", STANDIN_MODULE, *self.worker_args(self.prefill_indices()[0])]

    def standin_trigger(self, generation: int) -> Path:
        """The file whose creation activates stand-in number `generation` (each one waits for its own)."""
        return self.state_dir / "standin" / f"activate-{generation}"

    def standin_status_url(self) -> str:
        return f"http://{self.url_host}:{self.standin_status_port}"

    def standin_instance_file(self) -> Path:
        return self.state_dir / "instances" / "prefill-standin.json"

    def standin_env(self, generation: int) -> dict[str, str]:
        env = self.env()
        env[INSTANCE_FILE_ENV] = str(self.standin_instance_file())
        env[STANDIN_TRIGGER_ENV] = str(self.standin_trigger(generation))
        if self.standin_status_port:
            env["DYN_SYSTEM_PORT"] = str(self.standin_status_port)
        return env

    def status_url(self, index: int) -> str:
        return f"http://{self.url_host}:{self.status_ports[index]}"
