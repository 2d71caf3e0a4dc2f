"""Options that more than one command takes, each declared once: `--engines-dir` and the workload options.

- `engines_dir_option`: every command that finds or writes engine folders (build, generate, verify, lint-prompts,
  diagnose, deploy, calibrate, bench soak, profile, and the experiments' entry points). Its default is None, turned
  into `llmkiln.engine_dir.default_engines_root()` ($LLMKILN_ENGINES, else ./engines) when the command line is
  parsed, so a command always receives a folder and never hard-codes one.
- `workload_options` + `workload_spec(kw, num_requests)`: the synthetic workload's shape (`kiln bench`, `kiln
  profile`): one default each, the TTFT experiment's shared-prefix turn (1500-token system prompt, 80-120-token
  user turns, 32 output tokens).
- `sweep_options(concurrency, requests, warmup)` + `sweep_levels(kw)`: the load levels. Declared once; the
  defaults are the command's (`kiln bench` sweeps 1,4,8,16 cold, `kiln profile` looks at one warm level).
- `recipe_sets(items, flag)`: recipe overrides given as SECTION.FIELD=VALUE (`kiln profile --set`, `kiln serve
  --prefill-set`).
- `launch_options` + `launch_fields(kw)`: the Dynamo graph of `kiln serve --dynamo` and `kiln deploy dynamo`
  (--workers, --prefill-workers, --decode-workers, --kv-export-timeout, --max-local-prefill-tokens,
  --router-mode, --migration-limit). Their defaults are LaunchOptions' and KvTransferOptions' fields (read, not
  repeated), and the flags typed go to `LaunchOptions.given`, so both commands refuse what does not apply with
  the one check (llmkiln.dynamo.options).
- `given_flags()`: the flags typed on the current command line (not left at their default).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from llmkiln.bench.runner import parse_concurrency
from llmkiln.bench.workloads import WorkloadSpec, parse_range
from llmkiln.dynamo.options import ROUTER_MODES, LaunchOptions
from llmkiln.engine_dir import DEFAULT_ENGINES_ROOT, ENGINES_ENV, default_engines_root
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.jsonl import loads_json

F = TypeVar("F", bound=Callable[..., Any])

WORKLOADS = ("shared-prefix", "unique", "mixed-long-short", "jsonl")


def recipe_sets(items: tuple[str, ...], flag: str) -> dict[str, Any]:
    """('scheduler.tpot_slo_ms=50', ...) -> {"scheduler": {"tpot_slo_ms": 50}} (values parsed as JSON, else kept
    as strings). BadInput (exit 2) naming `flag` for an item that is not SECTION.FIELD=VALUE; the fields and values
    themselves are checked by the recipe schema where the overrides are applied."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise BadInput(
                f"{flag} {item!r}: give SECTION.FIELD=VALUE, e.g. scheduler.max_prefill_tokens=128"
            )
        try:
            value = loads_json(raw)
        except ValueError:
            value = raw
        node = out
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise BadInput(f"{flag} {item!r}: {p} is set to a value by another {flag} item")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise BadInput(f"{flag} {item!r}: {key} is a section (set its fields)")
        node[parts[-1]] = value
    return out


def _engines_root(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    return value if value is not None else default_engines_root()


engines_dir_option = click.option(
    "--engines-dir",
    "engines_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    callback=_engines_root,
    help="Where engine folders live: recipe-name ENGINEs are looked up there, builds write there "
    f"(and keep their caches under it) [default: ${ENGINES_ENV} or ./{DEFAULT_ENGINES_ROOT}].",
)


def _apply(f: F, opts: list[Callable[[F], F]]) -> F:
    for o in reversed(opts):
        f = o(f)
    return f


def workload_options(f: F) -> F:
    """--workload, --from-jsonl, --seed, --output-tokens and the per-workload lengths (see workload_spec)."""
    return _apply(
        f,
        [
            click.option(
                "--workload", type=click.Choice(WORKLOADS), default="shared-prefix", show_default=True
            ),
            click.option(
                "--from-jsonl",
                "jsonl",
                type=str,
                default=None,
                help="Recorded requests (implies --workload jsonl).",
            ),
            click.option("--seed", type=int, default=0, show_default=True, help="Workload seed."),
            click.option(
                "--output-tokens", type=int, default=32, show_default=True, help="max_tokens per request."
            ),
            click.option(
                "--output-spread",
                type=int,
                default=0,
                show_default=True,
                help="max_tokens per request drawn from --output-tokens ± this (0: all equal, and a closed "
                "loop then runs in lockstep waves).",
            ),
            click.option(
                "--system-tokens", type=int, default=1500, show_default=True, help="shared-prefix: S."
            ),
            click.option(
                "--system-prompts",
                type=int,
                default=1,
                show_default=True,
                help="shared-prefix: K distinct system prompts (each request draws one).",
            ),
            click.option(
                "--user-tokens", default="80-120", show_default=True, help="shared-prefix: U (N or MIN-MAX)."
            ),
            click.option(
                "--prompt-tokens", default="1550-1700", show_default=True, help="unique: prompt length."
            ),
            click.option(
                "--long-tokens",
                type=int,
                default=2048,
                show_default=True,
                help="mixed-long-short: long length.",
            ),
            click.option(
                "--short-tokens", default="32-128", show_default=True, help="mixed-long-short: short length."
            ),
            click.option(
                "--long-every",
                type=int,
                default=8,
                show_default=True,
                help="mixed-long-short: one long in N.",
            ),
        ],
    )


def workload_spec(kw: dict[str, Any], num_requests: int) -> WorkloadSpec:
    """The WorkloadSpec of the values workload_options parsed (`kw`: the command's keyword arguments)."""
    return WorkloadSpec(
        name="jsonl" if kw["jsonl"] else kw["workload"],
        num_requests=num_requests,
        seed=kw["seed"],
        output_tokens=kw["output_tokens"],
        output_spread=kw.get("output_spread", 0),
        system_tokens=kw["system_tokens"],
        num_system_prompts=kw["system_prompts"],
        user_tokens=parse_range(kw["user_tokens"], "--user-tokens"),
        prompt_tokens=parse_range(kw["prompt_tokens"], "--prompt-tokens"),
        long_tokens=kw["long_tokens"],
        short_tokens=parse_range(kw["short_tokens"], "--short-tokens"),
        long_every=kw["long_every"],
        jsonl_path=kw["jsonl"],
    )


def sweep_options(concurrency: str, requests: int, warmup: int) -> Callable[[F], F]:
    """--concurrency, --requests (as `requests_`), --warmup-requests with the command's defaults."""

    def deco(f: F) -> F:
        return _apply(
            f,
            [
                click.option(
                    "--concurrency", default=concurrency, show_default=True, help="Comma-separated levels."
                ),
                click.option(
                    "--requests",
                    "requests_",
                    type=int,
                    default=requests,
                    show_default=True,
                    help="Requests per level (at least the level's concurrency).",
                ),
                click.option(
                    "--warmup-requests",
                    type=int,
                    default=warmup,
                    show_default=True,
                    help="Requests sent first and not measured; 0 = cold mode.",
                ),
            ],
        )

    return deco


def sweep_levels(kw: dict[str, Any]) -> list[int]:
    """The concurrency levels of the values sweep_options parsed; bad input (exit 2) names the option."""
    levels = parse_concurrency(kw["concurrency"])
    if kw["requests_"] <= 0:
        raise BadInput(f"--requests must be positive, got {kw['requests_']}")
    if kw["warmup_requests"] < 0:
        raise BadInput(f"--warmup-requests must be zero or more, got {kw['warmup_requests']}")
    return levels


def given_flags() -> frozenset[str]:
    """The flags of the current command typed on its command line (each option's first name)."""
    ctx = click.get_current_context()
    return frozenset(
        p.opts[0]
        for p in ctx.command.params
        if isinstance(p, click.Option)
        and p.name is not None
        and ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT)
    )


LAUNCH_PARAMS = (
    "workers",
    "prefill_workers",
    "decode_workers",
    "kv_export_timeout",
    "max_local_prefill_tokens",
    "router_mode",
    "migration_limit",
)
_LAUNCH = LaunchOptions()


def launch_options(workers_names: tuple[str, ...] = ("--workers",), prefix: str = "") -> Callable[[F], F]:
    """The Dynamo graph's options (see the module docstring). `workers_names`: other names of --workers (`kiln
    deploy dynamo` also calls it --replicas); `prefix`: how each help line starts (`kiln serve`: "--dynamo: ")."""

    def deco(f: F) -> F:
        return _apply(
            f,
            [
                click.option(
                    *workers_names,
                    "workers",
                    type=int,
                    default=_LAUNCH.workers,
                    show_default=True,
                    help=f"{prefix}llmkiln workers (aggregated: each prefills and decodes).",
                ),
                click.option(
                    "--prefill-workers",
                    type=click.IntRange(0, 64),
                    default=_LAUNCH.prefill_workers,
                    help=f"{prefix}prefill/decode separation: this many prefill workers (with --decode-workers; "
                    "replaces --workers).",
                ),
                click.option(
                    "--decode-workers",
                    type=click.IntRange(0, 64),
                    default=_LAUNCH.decode_workers,
                    help=f"{prefix}decode workers beside --prefill-workers (the prompt's KV moves between them "
                    "with NIXL).",
                ),
                click.option(
                    "--kv-export-timeout",
                    type=float,
                    default=_LAUNCH.kv.export_timeout_s,
                    show_default=True,
                    help=f"{prefix}with prefill workers: seconds a prompt's exported KV stays pinned for a "
                    "decode worker.",
                ),
                click.option(
                    "--max-local-prefill-tokens",
                    type=int,
                    default=_LAUNCH.kv.max_local_prefill_tokens,
                    show_default=True,
                    help=f"{prefix}with prefill workers: a prompt whose uncached part is at most this many "
                    "tokens skips the prefill tier (the decode worker prefills it); 0: every prompt goes through "
                    "the prefill tier.",
                ),
                click.option(
                    "--router-mode",
                    type=click.Choice(ROUTER_MODES),
                    default=_LAUNCH.router_mode,
                    show_default=True,
                    help=f"{prefix}kv (to the worker holding the prompt's prefix) or round-robin / random.",
                ),
                click.option(
                    "--migration-limit",
                    type=int,
                    default=_LAUNCH.migration_limit,
                    show_default=True,
                    help=f"{prefix}times a request whose worker died moves to another worker.",
                ),
            ],
        )

    return deco


def launch_fields(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the values launch_options parsed from a command's keyword arguments: LaunchOptions' fields, with the
    flags typed as `given`. BadInput (exit 2) naming the flag for a bad KV transfer value."""
    v = {name: kw.pop(name) for name in LAUNCH_PARAMS}
    kv = KvTransferOptions(
        export_timeout_s=v.pop("kv_export_timeout"),
        max_local_prefill_tokens=v.pop("max_local_prefill_tokens"),
    )
    return {**v, "kv": kv, "given": given_flags()}
