"""The process layout of one Dynamo launch: a frontend and N llmkiln workers for one engine, their command lines
and environment. Pure data (llmkiln.dynamo.launcher runs it); nothing here imports `dynamo`.

One host needs no etcd or NATS: discovery is a folder (`DYN_DISCOVERY_BACKEND=file`, `DYN_FILE_KV`) that is
private to the launch and wiped when it starts (a crashed worker's keys would otherwise stay and be routed to),
requests travel over TCP and KV events over ZMQ. Every address is `host` (127.0.0.1 unless `--host` says
otherwise): the HTTP frontend, the TCP request plane, the response streams, the workers' status ports.
NOTE: Dynamo 1.6.1's ZMQ PUB sockets (KV events, active-sequence events) bind 0.0.0.0 whatever the advertised
address; only the address in discovery follows DYN_EVENT_PLANE_HOST (docs/serve.md, security).

Each worker's onnxruntime intra-op threads are capped to its share of the cores (cores // workers, at least
one), so N workers on a few cores do not oversubscribe them.

Prefill/decode separation (`prefill_workers` P and `decode_workers` D, both ≥ 1): workers 0..P-1 run `--role
prefill`, P..P+D-1 `--role decode` (llmkiln.host.roles); `workers` is then P + D, each with its core share.
Both roles get `--max-local-prefill-tokens` (prefill workers hand shorter uncached prompts to the decode worker,
which caps its prefill runs to it); prefill workers get the recipe fields of `prefill_overrides` over `overrides`.
`decode_first` (one CPU host): decode workers get every core and `--no-spin`, prefill workers their share and
`--compute-priority idle`, so decode steps, the front door and the KV transfers preempt the prefill tier's compute.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer import MAX_LOCAL_PREFILL_TOKENS
from llmkiln.runtime import compute_priority
from llmkiln.runtime.profile import PROFILE_ENV

RouterMode = Literal["kv", "round-robin", "random"]
ROUTER_MODES: tuple[str, ...] = get_args(RouterMode)
DISCOVERY_DIR = "discovery"
LOG_DIR = "logs"
WORKER_MODULE = "llmkiln.dynamo.worker"


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def merge_overrides(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Nested recipe overrides `top` over `base`, merged one section deep (copies; neither is changed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ClusterSpec:
    """One launch: what to serve, how many workers, where, how requests are routed."""

    engine: Path
    state_dir: Path  # the launch's folder: discovery/ (wiped at start) and logs/
    workers: int = 2
    host: str = "127.0.0.1"
    http_port: int = 8000  # the public port: llmkiln's OpenAI front (llmkiln.dynamo.openai_front)
    frontend_port: int = (
        0  # Dynamo's frontend, behind the front on loopback (0: no front, it takes http_port)
    )
    router_mode: RouterMode = "kv"
    migration_limit: int = 3  # times a request whose worker died is moved to another one
    threads_per_worker: int = 0  # 0: available cores // workers (at least 1)
    served_model_name: str | None = None  # default: the recipe's serve.model_name
    namespace: str = "llmkiln"
    overrides: dict[str, Any] = field(default_factory=dict)  # nested recipe fields for every worker
    kv_events: bool = True  # workers publish their block stores' events (needed by router_mode kv)
    grace_period_s: float = 5.0  # a stopping worker keeps serving this long after it unregistered
    drain_timeout_s: float = 30.0  # then waits at most this long for its requests in flight
    stall_timeout_s: float = (
        30.0  # the recipe's serve.stall_timeout_s: a worker silent or stalled this long is killed
    )
    status_ports: tuple[int, ...] = ()  # one per worker: /health and /metrics (llmkiln_* and dynamo_*)
    worker_command: tuple[str, ...] = (sys.executable, "-m", WORKER_MODULE)
    python: str = sys.executable
    log_level: str = "info"
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every process's environment
    frontend_args: tuple[str, ...] = ()  # more `python -m dynamo.frontend` flags (router policy, TLS, ...)
    # The KV router's default cost adds each worker's resident KV blocks of requests in flight (a GPU memory-
    # pressure signal). An llmkiln worker keeps a request's KV in its own preallocated slot, and a prefix miss
    # costs a whole prefill on a CPU, so counting those blocks as load pushes requests away from the worker that
    # holds their prefix under a burst (measured: kv-2w hit rate 0.84 with it, 0.96 without, = one worker holding
    # every prompt; bench/results/scaleout). Off by default; load is still balanced by prefill tokens in flight.
    track_active_blocks: bool = False
    prefill_workers: int = 0  # with decode_workers: prefill/decode separation (workers = the two added)
    decode_workers: int = 0
    kv_export_timeout_s: float = 30.0  # prefill workers release KV no decode worker read after this long
    # nested recipe fields for the prefill workers only, over `overrides` (a prefill tier runs no decodes: e.g.
    # smaller prefill chunks bound how long a short prompt waits behind a long one there)
    prefill_overrides: dict[str, Any] = field(default_factory=dict)
    # prompts whose uncached part is at most this many tokens skip the prefill tier (the decode worker prefills
    # them; KvTransfer.local_handoff); 0: every prompt is prefilled on the prefill tier
    max_local_prefill_tokens: int = MAX_LOCAL_PREFILL_TOKENS
    # each worker's engine appends its step profile (llmkiln.runtime.profile) to profile_dir/worker-<i>.jsonl
    profile_dir: Path | None = None
    # one CPU host, decode tier first: decode workers get every core (onnxruntime threads that do not spin), the
    # prefill workers' compute runs at idle priority (runtime.compute_priority) on the cycles the decode tier,
    # the front door and the transfers leave
    decode_first: bool = False

    @property
    def disaggregated(self) -> bool:
        return self.prefill_workers > 0 or self.decode_workers > 0

    def worker_role(self, index: int) -> str:
        """aggregated, prefill or decode (llmkiln.host.roles.WorkerRole values)."""
        if not self.disaggregated:
            return "aggregated"
        return "prefill" if index < self.prefill_workers else "decode"

    def check(self) -> None:
        if self.disaggregated:
            if self.prefill_workers < 1 or self.decode_workers < 1:
                raise BadInput(
                    f"--prefill-workers {self.prefill_workers} --decode-workers {self.decode_workers}: "
                    "prefill/decode separation needs at least one of each"
                )
            if self.workers != self.prefill_workers + self.decode_workers:
                raise ValueError(f"workers {self.workers} != prefill + decode workers")
            if self.kv_export_timeout_s <= 0:
                raise BadInput(f"--kv-export-timeout must be > 0, got {self.kv_export_timeout_s}")
            if self.decode_first and self.threads_per_worker:
                raise BadInput("--decode-first sets each tier's threads: drop --threads-per-worker")
            if self.decode_first:
                compute_priority.check("idle")  # Linux only (SCHED_IDLE)
            if self.max_local_prefill_tokens < 0:
                raise BadInput(
                    f"--max-local-prefill-tokens must be >= 0, got {self.max_local_prefill_tokens}"
                )
        elif self.decode_first:
            raise BadInput(
                "--decode-first is for prefill/decode separation: add --prefill-workers P --decode-workers D"
            )
        if self.workers < 1:
            raise BadInput(f"--workers must be at least 1, got {self.workers}")
        if self.router_mode not in ROUTER_MODES:
            raise BadInput(f"--router-mode {self.router_mode!r}: choose one of {', '.join(ROUTER_MODES)}")
        if self.migration_limit < 0:
            raise BadInput(f"--migration-limit must be >= 0, got {self.migration_limit}")
        if self.threads_per_worker < 0:
            raise BadInput(f"--threads-per-worker must be >= 0, got {self.threads_per_worker}")
        if not 0 <= self.http_port <= 65535:
            raise BadInput(f"--http-port {self.http_port} is out of range")
        if self.frontend_port and self.frontend_port == self.http_port:
            raise ValueError("the frontend port must differ from the public --http-port")
        if len(self.status_ports) != self.workers:
            raise ValueError(f"{self.workers} workers need as many status ports, got {self.status_ports}")

    @property
    def threads(self) -> int:
        """Intra-op threads of each worker (decode_first: of each prefill worker)."""
        return self.threads_per_worker or max(1, available_cores() // self.workers)

    def worker_threads(self, index: int) -> int:
        """Intra-op threads of worker `index`: its core share; with decode_first a decode worker's are every core."""
        if self.decode_first and self.worker_role(index) == "decode":
            return available_cores()
        return self.threads

    @property
    def discovery_dir(self) -> Path:
        return self.state_dir / DISCOVERY_DIR

    @property
    def log_dir(self) -> Path:
        return self.state_dir / LOG_DIR

    @property
    def url(self) -> str:
        """The OpenAI base URL (…/v1)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.http_port}/v1"

    @property
    def frontend_address(self) -> str:
        """host:port of Dynamo's own frontend (behind the front when frontend_port is set)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.frontend_port or self.http_port}"

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
                "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": f"{self.grace_period_s:g}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def frontend_command(self) -> list[str]:
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
            self.router_mode,
            "--migration-limit",
            str(self.migration_limit),
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
            "--event-plane",
            "zmq",
        ]
        if self.router_mode == "kv" and not self.kv_events:
            cmd.append("--no-router-kv-events")  # route from the router's own decisions
        if self.router_mode == "kv" and not self.track_active_blocks:
            cmd.append("--no-router-track-active-blocks")
        return [*cmd, *self.frontend_args]

    def worker_env(self, index: int) -> dict[str, str]:
        env = self.env()
        env.update(
            {
                "DYN_SYSTEM_ENABLED": "true",
                "DYN_SYSTEM_PORT": str(self.status_ports[index]),
                # /health follows the generate endpoint's canary checks, not just the process being up
                "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
            }
        )
        if self.profile_dir is not None:
            env[PROFILE_ENV] = str(self.profile_path(index))
        return env

    def profile_path(self, index: int) -> Path:
        """Where worker `index` writes its step profile (with profile_dir set)."""
        assert self.profile_dir is not None
        return self.profile_dir / f"worker-{index}.jsonl"

    def worker_args(self, index: int = 0) -> list[str]:
        args = [
            "--engine",
            str(self.engine),
            "--namespace",
            self.namespace,
            "--threads",
            str(self.worker_threads(index)),
            "--drain-timeout",
            f"{self.drain_timeout_s:g}",
        ]
        overrides = self.worker_overrides(index)
        if overrides:
            args += ["--overrides", json.dumps(overrides, sort_keys=True)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if not self.kv_events:
            args.append("--no-kv-events")
        if self.disaggregated:
            args += [
                "--role",
                self.worker_role(index),
                "--kv-export-timeout",
                f"{self.kv_export_timeout_s:g}",
            ]
            # prefill: the hand-off threshold; decode: its prefill runs are capped to it (llmkiln.dynamo.worker)
            args += ["--max-local-prefill-tokens", str(self.max_local_prefill_tokens)]
            if self.decode_first:
                args += (
                    ["--compute-priority", "idle"] if self.worker_role(index) == "prefill" else ["--no-spin"]
                )
        return args

    def worker_overrides(self, index: int) -> dict[str, Any]:
        """The recipe overrides of worker `index`: `overrides`, with `prefill_overrides` on top for prefill workers
        (merged one section deep)."""
        if self.worker_role(index) == "prefill":
            return merge_overrides(self.overrides, self.prefill_overrides)
        return merge_overrides(self.overrides, {})

    def worker_commandline(self, index: int = 0) -> list[str]:
        return [*self.worker_command, *self.worker_args(index)]

    def status_url(self, index: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.status_ports[index]}"
