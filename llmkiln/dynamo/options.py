"""The options of a Dynamo launch, each default declared once and checked in one place.

- `LaunchOptions`: the graph both `kiln serve ENGINE --dynamo` and `kiln deploy dynamo RECIPE` launch — N
  aggregated workers, or P prefill + D decode workers (prefill/decode separation) with their KV transfer
  options (llmkiln.host.kv_transfer_options), the router and the migration limit.
- `DynamoOptions` (`kiln serve --dynamo`, llmkiln.dynamo.launcher) and `DeployOptions` (`kiln deploy dynamo`,
  llmkiln.dynamo.deploy) add what only a local launch or only a Kubernetes deployment has.

`check()` runs when an object is made (and on every `dataclasses.replace`): BadInput (exit 2) naming the flag and
what to do. The flags are the same on both commands, so a combination that does not apply is refused by both
with the same message. A flag counts as given when `given` names it (the CLI passes the flags typed on the
command line, so `--max-local-prefill-tokens 128` without prefill workers is refused although 128 is the
default) or when its value differs from the default (options made in code).

Recipe-dependent checks (prefix_reuse for separation, --prefill-set fields, backends) are made where the recipe
is read: llmkiln.dynamo.launcher.make_spec, llmkiln.dynamo.deploy.deployment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime import compute_priority

RouterMode = Literal["kv", "round-robin", "random"]
ROUTER_MODES: tuple[str, ...] = get_args(RouterMode)
TIERS_HINT = "add --prefill-workers P --decode-workers D, or remove them"


def field_default(cls: type, name: str) -> Any:
    """The default a dataclass declares for field `name` (its default_factory called)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            break
    raise KeyError(f"{cls.__name__}.{name} has no default")


@dataclass(frozen=True)
class LaunchOptions:
    """The Dynamo graph: `workers` aggregated workers, or `prefill_workers` + `decode_workers` (both >= 1, and
    then `workers` is not given: their sum is the worker count) with `kv`, the KV transfer between them; the
    frontend's router mode and how often a request whose worker died moves to another one."""

    workers: int = 2
    prefill_workers: int = 0
    decode_workers: int = 0
    router_mode: RouterMode = "kv"
    migration_limit: int = 3
    kv: KvTransferOptions = field(default_factory=KvTransferOptions)
    # the flags given on a command line (e.g. "--workers"); see the module docstring
    given: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    # field -> flag, for the fields whose being given is checked (is_given)
    FLAGS: ClassVar[dict[str, str]] = {"workers": "--workers"}

    def __post_init__(self) -> None:
        self.check()

    # -- what was given --------------------------------------------------------------------------------------
    def is_given(self, name: str) -> bool:
        """Field `name` (of this class or a subclass, its flag in FLAGS) was given or differs from its default."""
        return self.FLAGS[name] in self.given or getattr(self, name) != field_default(type(self), name)

    def tier_flags_given(self) -> list[str]:
        """The flags given that apply only to prefill/decode separation (subclasses add theirs)."""
        kv_flags = set(self.kv.flags_changed())
        return [f for f in KvTransferOptions.FLAGS.values() if f in self.given or f in kv_flags]

    # -- the one check ---------------------------------------------------------------------------------------
    def check(self) -> None:
        """BadInput naming the flag for a bad value or a combination that does not apply."""
        if self.workers < 1:
            raise BadInput(f"--workers must be at least 1, got {self.workers}")
        if self.prefill_workers < 0 or self.decode_workers < 0:
            raise BadInput(
                f"--prefill-workers {self.prefill_workers} --decode-workers {self.decode_workers}: "
                "counts must be >= 0"
            )
        if self.disaggregated:
            if not (self.prefill_workers and self.decode_workers):
                raise BadInput("--prefill-workers and --decode-workers go together (at least 1 each)")
            if self.is_given("workers"):
                raise BadInput(
                    "--workers is the aggregated mode: give --prefill-workers and --decode-workers instead"
                )
        else:
            extra = self.tier_flags_given()
            if extra:
                raise BadInput(f"{', '.join(extra)}: flag(s) of prefill/decode separation: {TIERS_HINT}")
        if self.router_mode not in ROUTER_MODES:
            raise BadInput(f"--router-mode {self.router_mode!r}: choose one of {', '.join(ROUTER_MODES)}")
        if self.migration_limit < 0:
            raise BadInput(f"--migration-limit must be >= 0, got {self.migration_limit}")

    # -- the layout ------------------------------------------------------------------------------------------
    @property
    def disaggregated(self) -> bool:
        return self.prefill_workers > 0 or self.decode_workers > 0

    @property
    def num_workers(self) -> int:
        """Every worker of the graph: `workers`, or prefill + decode workers."""
        return self.prefill_workers + self.decode_workers if self.disaggregated else self.workers

    def worker_role(self, index: int) -> WorkerRole:
        """Worker `index`'s role: aggregated, or prefill for 0..P-1 and decode for P..P+D-1."""
        if not self.disaggregated:
            return WorkerRole.AGGREGATED
        return WorkerRole.PREFILL if index < self.prefill_workers else WorkerRole.DECODE


@dataclass(frozen=True)
class DynamoOptions(LaunchOptions):
    """`kiln serve ENGINE --dynamo`: the graph on this host. None = the default noted."""

    host: str = "127.0.0.1"  # every address of the launch
    http_port: int | None = None  # the recipe's serve.http_port
    threads_per_worker: int = 0  # available cores // workers (at least 1)
    state_dir: Path | None = None  # a fresh temp folder, removed after a clean stop
    grace_period_s: float = 5.0  # a stopping worker keeps serving this long after it unregistered
    drain_timeout_s: float | None = None  # the recipe's serve.exit_timeout_s
    overrides: dict[str, Any] = field(default_factory=dict)  # nested recipe fields for every worker
    # nested recipe fields for the prefill workers only, over `overrides` (a prefill tier runs no decodes: e.g.
    # smaller prefill chunks bound how long a short prompt waits behind a long one there)
    prefill_overrides: dict[str, Any] = field(default_factory=dict)
    # one CPU host, decode tier first: decode workers get every core (onnxruntime threads that do not spin), the
    # prefill workers' compute runs at idle priority (runtime.compute_priority) on the cycles the decode tier,
    # the front door and the transfers leave. None: chosen from the cores (decode_first_choice)
    decode_first: bool | None = None
    engines_root: Path | None = None
    frontend_args: tuple[str, ...] = ()  # more `python -m dynamo.frontend` flags (router policy, TLS, ...)
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every process's environment
    profile_dir: Path | None = None  # each worker's step profile: profile_dir/worker-<i>.jsonl

    FLAGS: ClassVar[dict[str, str]] = {
        **LaunchOptions.FLAGS,
        "prefill_overrides": "--prefill-set",
        "decode_first": "--decode-first",
    }

    def tier_flags_given(self) -> list[str]:
        return [
            *super().tier_flags_given(),
            *(self.FLAGS[n] for n in ("prefill_overrides", "decode_first") if self.is_given(n)),
        ]

    def check(self) -> None:
        super().check()
        if self.threads_per_worker < 0:
            raise BadInput(
                f"--threads-per-worker must be >= 0 (0: cores // workers), got {self.threads_per_worker}"
            )
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise BadInput(f"--http-port {self.http_port} is out of range")
        if self.grace_period_s < 0:
            raise BadInput(f"--grace-period must be >= 0, got {self.grace_period_s:g}")
        if self.drain_timeout_s is not None and self.drain_timeout_s < 0:
            raise BadInput(f"--exit-timeout must be >= 0, got {self.drain_timeout_s:g}")
        if self.decode_first:  # given, with prefill/decode separation (else refused above)
            if self.threads_per_worker:
                raise BadInput("--decode-first sets each tier's threads: drop --threads-per-worker")
            compute_priority.check("idle")  # Linux only (SCHED_IDLE)
