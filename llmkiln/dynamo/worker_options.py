"""One llmkiln Dynamo worker's options: its command line, both ways.

    python -m llmkiln.dynamo.worker --engine engines/NAME [--threads 1] [--overrides JSON] [--no-kv-events]
                                    [--role aggregated|prefill|decode] [--kv-export-timeout 30]
                                    [--max-local-prefill-tokens 128] [--compute-priority normal|idle] [--no-spin]

`WorkerOptions.to_argv()` is what the launcher (llmkiln.dynamo.cluster) starts and what a deployment
(llmkiln.dynamo.deploy) writes in a pod spec; `WorkerOptions.from_argv(argv)` is what the worker process
(llmkiln.dynamo.worker) parses — the same object back (tests: the round trip). Each default is the dataclass
field's; the parser declares none. Nothing here imports `dynamo`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.capabilities import Backend
from llmkiln.dynamo.options import field_default
from llmkiln.errors import BadInput
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.compute_priority import COMPUTE_PRIORITIES, ComputePriority

WORKER_MODULE = "llmkiln.dynamo.worker"
NAMESPACE = "llmkiln"
COMPONENT = "backend"
PREFILL_COMPONENT = "prefill"  # prefill workers register apart from the decode/aggregated ones
ENDPOINT = "generate"


def _number(value: float) -> str:
    """A float as a command line writes it: 30 for 30.0, and exactly (repr) when %g would round it."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True)
class WorkerOptions:
    """The worker's command line (see the module docstring). `component` None: COMPONENT, or PREFILL_COMPONENT
    for a prefill worker. The role's own options (`role`, `kv`, `compute_priority`) are checked by the
    HostOptions they become (llmkiln.host.engine_host)."""

    engine: Path
    served_model_name: str | None = None  # the recipe's serve.model_name
    namespace: str = NAMESPACE
    component: str | None = None
    endpoint: str = ENDPOINT
    threads: int = 0  # onnxruntime intra-op / OpenVINO threads (0: the recipe's setting)
    overrides: dict[str, Any] = field(default_factory=dict)  # nested recipe fields
    kv_events: bool = True  # publish the block store's events (KV routing)
    warmup: bool = True  # run the recipe's warmup before registering
    drain_timeout_s: float = 30.0  # at shutdown, seconds requests in flight get to finish
    role: WorkerRole = WorkerRole.AGGREGATED
    kv: KvTransferOptions = field(default_factory=KvTransferOptions)  # prefill and decode roles
    compute_priority: ComputePriority = "normal"  # the engine's scheduler thread
    spinning: bool = True  # False: scheduler.intra_op_spinning false (onnxruntime engines)

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", Path(self.engine))
        if self.threads < 0:
            raise BadInput(f"--threads must be >= 0, got {self.threads}")
        if not isinstance(self.overrides, dict):
            raise BadInput(f"--overrides must be a JSON object, got {self.overrides!r}")
        if self.drain_timeout_s < 0:
            raise BadInput(f"--drain-timeout must be >= 0, got {self.drain_timeout_s:g}")
        object.__setattr__(self, "role", self.host_options().role)  # the role's checks, and the member

    @property
    def component_name(self) -> str:
        """The Dynamo component this worker registers in."""
        if self.component is not None:
            return self.component
        return PREFILL_COMPONENT if self.role is WorkerRole.PREFILL else COMPONENT

    def host_options(self, overrides: Mapping[str, Any] | None = None) -> HostOptions:
        """How this worker's host opens the engine (`overrides`: the recipe fields it runs with)."""
        return HostOptions(
            overrides=overrides, role=self.role, kv=self.kv, compute_priority=self.compute_priority
        )

    def engine_overrides(self, backend: Backend | None = None) -> dict[str, Any]:
        """The recipe overrides, with the thread cap in scheduler.intra_op_threads (and, on an onnxruntime
        `backend`, --no-spin in scheduler.intra_op_spinning: other backends refuse that field)."""
        out = {k: dict(v) if isinstance(v, dict) else v for k, v in self.overrides.items()}
        if self.threads:
            out.setdefault("scheduler", {})["intra_op_threads"] = self.threads
        if not self.spinning and backend in (Backend.ONNX_CPU, Backend.ONNX_GPU):
            out.setdefault("scheduler", {})["intra_op_spinning"] = False
        return out

    # -- the command line ------------------------------------------------------------------------------------
    def to_argv(self) -> list[str]:
        """The worker's arguments: --engine, then every field that differs from its default; a prefill or
        decode worker's role and KV options are written in full (a pod spec or `ps` shows them)."""
        d = _defaults()
        argv = ["--engine", str(self.engine)]
        if self.served_model_name is not None:
            argv += ["--served-model-name", self.served_model_name]
        if self.namespace != d["namespace"]:
            argv += ["--namespace", self.namespace]
        if self.component is not None:
            argv += ["--component", self.component]
        if self.endpoint != d["endpoint"]:
            argv += ["--endpoint", self.endpoint]
        if self.threads != d["threads"]:
            argv += ["--threads", str(self.threads)]
        if self.drain_timeout_s != d["drain_timeout_s"]:
            argv += ["--drain-timeout", _number(self.drain_timeout_s)]
        if self.overrides:
            argv += ["--overrides", json.dumps(self.overrides, sort_keys=True)]
        if not self.kv_events:
            argv.append("--no-kv-events")
        if not self.warmup:
            argv.append("--no-warmup")
        if self.role.moves_kv:
            argv += [
                "--role",
                self.role.value,
                "--kv-export-timeout",
                _number(self.kv.export_timeout_s),
                "--max-local-prefill-tokens",
                str(self.kv.max_local_prefill_tokens),
            ]
        if self.compute_priority != d["compute_priority"]:
            argv += ["--compute-priority", self.compute_priority]
        if not self.spinning:
            argv.append("--no-spin")
        return argv

    @classmethod
    def from_argv(cls, argv: list[str] | None) -> WorkerOptions:
        """Parse a worker's arguments (argparse: exit 2 with the message for a bad one)."""
        p = _parser()
        a = vars(p.parse_args(argv))  # only the flags given (every default is SUPPRESS)
        kw: dict[str, Any] = {"engine": Path(a.pop("engine"))}
        for name in (
            "served_model_name",
            "namespace",
            "component",
            "endpoint",
            "threads",
            "compute_priority",
        ):
            if name in a:
                kw[name] = a.pop(name)
        if "overrides" in a:
            try:
                kw["overrides"] = json.loads(a.pop("overrides"))
            except ValueError as exc:
                p.error(f"--overrides: not JSON ({exc})")
        if "drain_timeout" in a:
            kw["drain_timeout_s"] = a.pop("drain_timeout")
        if "role" in a:
            kw["role"] = WorkerRole(a.pop("role"))
        for off, name in (("no_kv_events", "kv_events"), ("no_warmup", "warmup"), ("no_spin", "spinning")):
            if a.pop(off, False):
                kw[name] = False
        kv: dict[str, Any] = {}
        if "kv_export_timeout" in a:
            kv["export_timeout_s"] = a.pop("kv_export_timeout")
        if "max_local_prefill_tokens" in a:
            kv["max_local_prefill_tokens"] = a.pop("max_local_prefill_tokens")
        assert not a, f"unhandled worker arguments {sorted(a)}"
        try:
            if kv:
                kw["kv"] = KvTransferOptions(**kv)
            return cls(**kw)
        except BadInput as exc:
            p.error(str(exc))


def _defaults() -> dict[str, Any]:
    return {
        name: field_default(WorkerOptions, name)
        for name in ("namespace", "endpoint", "threads", "drain_timeout_s", "compute_priority")
    }


def _parser() -> argparse.ArgumentParser:
    d = _defaults()
    kv = KvTransferOptions()
    p = argparse.ArgumentParser(
        prog=f"python -m {WORKER_MODULE}",
        description="An llmkiln engine host behind Dynamo's Python engine contract.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--engine", required=True, help="Engine folder (built by `kiln build`).")
    p.add_argument("--served-model-name", help="Default: the recipe's serve.model_name.")
    p.add_argument("--namespace", help=f"Dynamo namespace (default {d['namespace']}).")
    p.add_argument("--component", help=f"Default: {COMPONENT} ({PREFILL_COMPONENT} for prefill).")
    p.add_argument("--endpoint", help=f"Default: {d['endpoint']}.")
    p.add_argument(
        "--threads",
        type=int,
        help=f"Intra-op threads of the engine (default {d['threads']}: the recipe's setting).",
    )
    p.add_argument("--overrides", help='Nested recipe fields as JSON, e.g. {"kv_cache": {"max_bytes": 1}}.')
    p.add_argument("--no-kv-events", action="store_true", help="Publish no KV events (no KV routing).")
    p.add_argument("--no-warmup", action="store_true", help="Register without running the warmup.")
    p.add_argument(
        "--drain-timeout",
        type=float,
        help="At shutdown, seconds requests in flight get to finish (the drain ends as soon as none is left; "
        f"default {d['drain_timeout_s']:g}).",
    )
    p.add_argument(
        "--role",
        choices=[r.value for r in WorkerRole],
        help="What this worker serves: aggregated (default), or the prefill / decode tier (registered with "
        "Dynamo's matching disaggregation mode).",
    )
    p.add_argument(
        "--kv-export-timeout",
        type=float,
        help="Prefill role: release a prompt's exported KV blocks after this many seconds if no decode worker "
        f"has read them (default {kv.export_timeout_s:g}).",
    )
    p.add_argument(
        "--max-local-prefill-tokens",
        type=int,
        help="Prefill role: a prompt whose uncached part is at most this many tokens is handed back at once "
        "for the decode worker to prefill itself (0: every prompt is prefilled here). Decode role: its prefill "
        "runs are capped to this many tokens while sequences decode (scheduler.max_prefill_tokens_decoding, unless "
        f"--overrides sets it). Default {kv.max_local_prefill_tokens}.",
    )
    p.add_argument(
        "--compute-priority",
        choices=list(COMPUTE_PRIORITIES),
        help="CPU priority of the engine's compute (idle: only cycles no other thread wants; what "
        f"`kiln serve --decode-first` gives the prefill tier; default {d['compute_priority']}).",
    )
    p.add_argument(
        "--no-spin",
        action="store_true",
        help="onnxruntime's intra-op threads sleep between operators instead of spinning "
        "(scheduler.intra_op_spinning false; for cores shared with other processes).",
    )
    return p
