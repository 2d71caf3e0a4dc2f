"""`diagnose`: sources (metrics URLs, saved snapshots, bench reports) -> Signals -> the filled table -> overlay."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from llmkiln.bench.report import load_report
from llmkiln.diagnose.from_bench import signals_from_bench
from llmkiln.diagnose.from_metrics import signals_from_metrics
from llmkiln.diagnose.overlay import write_overlay
from llmkiln.diagnose.rules import evaluate
from llmkiln.diagnose.signals import Signals
from llmkiln.diagnose.snapshot import MetricSnapshot, read_snapshot, scrape
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe


class RowOut(BaseModel):
    """One filled line of the table."""

    model_config = ConfigDict(extra="forbid")

    symptom: str
    cause: str
    next_step: str
    status: Literal["yes", "no", "no data"]
    figures: list[str]
    changes: dict[str, Any]


class Diagnosis(BaseModel):
    """What `kiln diagnose` prints (`--json`)."""

    model_config = ConfigDict(extra="forbid")

    sources: list[str]
    recipe: str | None
    figures: dict[str, dict[str, Any]]  # name -> {value, source}
    rows: list[RowOut]
    changes: dict[str, Any]  # every row's changes together (what the overlay sets)
    notes: list[str]
    overlay: str | None = None


def collect_signals(
    metrics_urls: Sequence[str], files: Sequence[Path], recipe: Recipe | None
) -> tuple[Signals, list[str]]:
    """Signals from every source, the earlier ones first (a figure comes from the first source that has it)."""
    snapshot = MetricSnapshot()
    reports = []
    for url in metrics_urls:
        snapshot.add_text(scrape(url), url)
    for path in files:
        path = Path(path)
        text = read_snapshot(path)
        if text.lstrip().startswith("{"):
            reports.append((path, load_report(path)))
        else:
            snapshot.add_text(text, str(path))
    if not snapshot.sources and not reports:
        raise BadInput(
            "nothing to diagnose: give --metrics URL, a saved metrics snapshot, or a `kiln bench` report"
        )
    sig = signals_from_metrics(snapshot) if snapshot.sources else Signals()
    for _, report in reports:
        sig = sig.merge(signals_from_bench(report, recipe))
    return sig, [*snapshot.sources, *(str(p) for p, _ in reports)]


def diagnose(
    metrics_urls: Sequence[str],
    files: Sequence[Path],
    recipe: Recipe | None = None,
    overlay_out: Path | None = None,
    recipe_file: Path | None = None,
) -> Diagnosis:
    sig, sources = collect_signals(metrics_urls, files, recipe)
    rows = evaluate(sig, recipe)
    changes: dict[str, Any] = {}
    why: dict[str, str] = {}
    for row in rows:
        if row.status == "yes":
            for field, value in row.changes.items():
                changes.setdefault(field, value)
                why.setdefault(field, row.symptom)
    overlay = None
    if overlay_out is not None:
        if recipe is None:
            raise BadInput("--recipe-overlay needs the current recipe: give --engine ENGINE or --recipe NAME")
        if not changes:
            raise BadInput(f"--recipe-overlay {overlay_out}: no row applies, so there is nothing to change")
        write_overlay(overlay_out, recipe.name, changes, why, ", ".join(sources), recipe_file)
        overlay = str(overlay_out)
    return Diagnosis(
        sources=sources,
        recipe=recipe.name if recipe is not None else None,
        figures={k: {"value": v.value, "source": v.source} for k, v in sig.known().items()},
        rows=[
            RowOut(
                symptom=r.symptom,
                cause=r.cause,
                next_step=r.next_step,
                status=r.status,
                figures=r.figures,
                changes=r.changes,
            )
            for r in rows
        ],
        changes=changes,
        notes=sig.notes,
        overlay=overlay,
    )
