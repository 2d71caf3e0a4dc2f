"""Benchmark reports: a typed JSON file (schema llmkiln.bench/1), a rich console table and a Markdown table."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.table import Table

from llmkiln.bench.profile import LevelProfile
from llmkiln.bench.stats import Dist, LevelStats, RequestRecord
from llmkiln.cpu_features import detect
from llmkiln.errors import BadInput

SCHEMA: Final = "llmkiln.bench/1"


class RunInfo(BaseModel):
    """How a run was made: target, workload, mode and the machine."""

    model_config = ConfigDict(extra="forbid")

    label: str
    system: str = (
        "llmkiln"  # llmkiln (served) or a peer: onnxruntime-genai-engine, onnxruntime-genai-generator, ...
    )
    url: str | None = None
    model: str | None = None
    workload: dict[str, Any]
    mode: Literal["warm", "cold"]
    warmup_requests: int
    requests_per_level: int
    api: str = "triton"  # triton (gRPC, tensorrtllm_backend I/O), chat or completions (OpenAI endpoint)
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    machine: dict[str, Any] = Field(default_factory=lambda: machine_info())
    extra: dict[str, Any] = Field(default_factory=dict)  # recipe name, engine folder, runtime settings...


class BenchReport(BaseModel):
    """One benchmark run: per concurrency level statistics (plus TTFT samples for CDF plots)."""

    model_config = ConfigDict(extra="forbid")

    schema_: Literal["llmkiln.bench/1"] = Field(SCHEMA, alias="schema")
    run: RunInfo
    levels: list[LevelStats]
    ttft_samples_ms: dict[str, list[float]] = Field(default_factory=dict)  # str(concurrency) -> per request
    profile: dict[str, LevelProfile] = Field(default_factory=dict)  # str(concurrency) -> step profile

    def level(self, concurrency: int) -> LevelStats | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)


def machine_info() -> dict[str, Any]:
    """The CPU (name, kind, features: llmkiln.cpu_features), CPU count, platform and the versions that matter
    for the numbers."""
    versions: dict[str, str | None] = {}
    for pkg in (
        "llmkiln",
        "onnxruntime",
        "onnxruntime-genai",
        "openvino",
        "tritonclient",
        "nvidia-pytriton",
        "torch",
        "ai-dynamo",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "cpu": detect().describe(),
        "cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "versions": versions,
    }


def make_report(
    run: RunInfo, levels: list[LevelStats], records: dict[int, list[RequestRecord]]
) -> BenchReport:
    """A report from level statistics and the per-level records (for the TTFT samples)."""
    samples = {
        str(c): [r.ttft_ms for r in recs if r.ok and r.ttft_ms is not None] for c, recs in records.items()
    }
    return BenchReport(run=run, levels=levels, ttft_samples_ms=samples)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_report(report: BenchReport, path: Path) -> None:
    write_atomic(Path(path), report.model_dump_json(indent=2, by_alias=True) + "\n")


def load_report(path: str | Path) -> BenchReport:
    """Read a report file; BadInput (exit 2) when it is missing or not a llmkiln.bench/1 report."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such report file; give a JSON file written by `kiln bench --out`")
    try:
        return BenchReport.model_validate_json(p.read_text(encoding="utf-8"))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise BadInput(f"{p}: not a {SCHEMA} report (field '{loc}': {first['msg']})") from None


def save_records(records: dict[int, list[RequestRecord]], path: Path) -> None:
    """Raw per-request records as JSONL (one line per request, with its concurrency level)."""
    lines = []
    for c, recs in records.items():
        for r in recs:
            d = {k: v for k, v in r.__dict__.items()}
            d["concurrency"] = c
            lines.append(json.dumps(d))
    write_atomic(Path(path), "\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Rendering

COLUMNS = (
    ("conc", lambda lv: str(lv.concurrency)),
    ("ok/err", lambda lv: f"{lv.num_ok}/{lv.num_errors}"),
    ("TTFT p50", lambda lv: _ms(lv.ttft_ms, "p50")),
    ("TTFT p90", lambda lv: _ms(lv.ttft_ms, "p90")),
    ("TTFT p95", lambda lv: _ms(lv.ttft_ms, "p95")),
    ("TTFT p99", lambda lv: _ms(lv.ttft_ms, "p99")),
    ("TTFT mean", lambda lv: _ms(lv.ttft_ms, "mean")),
    ("srv TTFT p50", lambda lv: _ms(lv.server_ttft_ms, "p50")),
    ("srv queue p50", lambda lv: _ms(lv.server_queue_ms, "p50")),
    ("TPOT p50", lambda lv: _ms(lv.tpot_ms, "p50")),
    ("TPOT p95", lambda lv: _ms(lv.tpot_ms, "p95")),
    ("ITL p50", lambda lv: _ms(lv.itl_ms, "p50")),
    ("ITL p95", lambda lv: _ms(lv.itl_ms, "p95")),
    ("e2e p50", lambda lv: _ms(lv.e2e_ms, "p50")),
    ("e2e p95", lambda lv: _ms(lv.e2e_ms, "p95")),
    ("req/s", lambda lv: f"{lv.request_throughput:.2f}"),
    ("out tok/s", lambda lv: f"{lv.output_token_throughput:.1f}"),
    ("cached", lambda lv: "-" if lv.cached_tokens_mean is None else f"{lv.cached_tokens_mean:.0f}"),
    ("hit rate", lambda lv: "-" if lv.prefix_hit_rate is None else f"{lv.prefix_hit_rate:.2f}"),
    ("rate", lambda lv: "-" if lv.request_rate is None else f"{lv.request_rate:g}/s"),
    ("goodput", lambda lv: "-" if lv.goodput is None else f"{lv.goodput.goodput_rps:.2f}/s"),
    ("SLO att.", lambda lv: "-" if lv.goodput is None else f"{lv.goodput.attainment:.0%}"),
    ("spec acc.", lambda lv: _spec(lv, "acceptance_rate", "{:.2f}")),
    ("spec len", lambda lv: _spec(lv, "mean_accepted_length", "{:.2f}")),
)


def _spec(lv: LevelStats, field: str, fmt: str) -> str:
    """A speculative-decoding figure of the level ('-' when not measured or nothing was drafted)."""
    value = None if lv.speculative is None else getattr(lv.speculative, field)
    return "-" if value is None else fmt.format(value)


def _ms(d: Dist, stat: str) -> str:
    v = getattr(d, stat)
    return "-" if v is None else f"{v:.1f}"


CONSOLE_COLUMNS: tuple[str, ...] = (
    "conc",
    "ok/err",
    "TTFT p50",
    "TTFT p95",
    "TTFT p99",
    "TTFT mean",
    "TPOT p50",
    "ITL p95",
    "e2e p50",
)
CONSOLE_COLUMNS += ("req/s", "out tok/s", "cached", "hit rate", "goodput", "SLO att.")
SPEC_COLUMNS = ("spec acc.", "spec len")  # shown when the run measured speculation (kiln bench --metrics)


def console_table(report: BenchReport) -> Table:
    """A rich table, one row per concurrency level (times in ms; the Markdown table has every column)."""
    wl = report.run.workload
    table = Table(title=f"{report.run.label}: {wl.get('name')} ({report.run.mode}), times in ms", box=None)
    shown = CONSOLE_COLUMNS + (SPEC_COLUMNS if any(lv.speculative for lv in report.levels) else ())
    cols = [(n, f) for n, f in COLUMNS if n in shown]
    for name, _ in cols:
        table.add_column(name.replace(" ", "\n"), justify="right")
    for lv in report.levels:
        table.add_row(*(f(lv) for _, f in cols))
    return table


def print_report(report: BenchReport, console: Console | None = None) -> None:
    console = console or Console()
    console.print(console_table(report))
    for lv in report.levels:
        for err in lv.errors:
            console.print(f"[red]c={lv.concurrency} error:[/red] {err}")


def markdown_table(report: BenchReport) -> str:
    """Every column as GitHub Markdown (the speculative-decoding ones only when the run measured them)."""
    measured = any(lv.speculative for lv in report.levels)
    cols = [(n, f) for n, f in COLUMNS if measured or n not in SPEC_COLUMNS]
    head = "| " + " | ".join(n for n, _ in cols) + " |"
    sep = "|" + "|".join("---:" for _ in cols) + "|"
    rows = ["| " + " | ".join(f(lv) for _, f in cols) + " |" for lv in report.levels]
    return "\n".join([head, sep, *rows])


def markdown_report(report: BenchReport) -> str:
    r = report.run
    slo = next((lv.goodput.slo for lv in report.levels if lv.goodput is not None), None)
    slo_text = f" Goodput SLO: TTFT ≤ {slo.ttft_ms:g} ms, TPOT ≤ {slo.tpot_ms:g} ms." if slo else ""
    lines = [
        f"### {r.label}: `{r.workload.get('name')}` ({r.mode}, {r.requests_per_level} requests per level)",
        "",
        f"Workload parameters: `{json.dumps(r.workload.get('params', {}))}`; times in ms.{slo_text}",
        "",
        markdown_table(report),
        "",
    ]
    return "\n".join(lines)
