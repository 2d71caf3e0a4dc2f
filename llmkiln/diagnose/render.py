"""The diagnosis as a table for people."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from llmkiln.diagnose.diagnosis import Diagnosis

_MARK = {"yes": "[bold red]yes[/]", "no": "[green]no[/]", "no data": "[dim]no data[/]"}


def print_diagnosis(d: Diagnosis, console: Console | None = None) -> None:
    console = console or Console(width=160)
    console.print(f"sources: {', '.join(d.sources)}" + (f"   recipe: {d.recipe}" if d.recipe else ""))
    table = Table(show_lines=True, title="symptom -> likely cause -> next step")
    for col in ("applies", "symptom", "likely cause", "next step (recipe fields)", "figures"):
        table.add_column(col, overflow="fold")
    for r in d.rows:
        changes = "\n".join(f"-> {k}: {json.dumps(v)}" for k, v in r.changes.items())
        table.add_row(
            _MARK[r.status],
            r.symptom,
            r.cause,
            r.next_step + ("\n" + changes if changes else ""),
            "\n".join(r.figures),
        )
    console.print(table)
    for note in d.notes:
        console.print(f"note: {note}")
    if d.changes:
        console.print("recipe changes: " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in d.changes.items()))
    if d.overlay:
        console.print(f"recipe overlay written: {d.overlay} (build it with `kiln build {d.overlay}`)")
