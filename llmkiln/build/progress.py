"""Build progress reporting: one line per stage (name, time, cached?) with rich, nothing (--quiet), or JSON lines.

The pipeline calls a BuildProgress; the CLI picks the implementation with make_progress(mode).
"""

from __future__ import annotations

import json
from typing import IO, Any, Literal, Protocol

from llmkiln.build.logs import private_stdout

ProgressMode = Literal["rich", "quiet", "json"]


class BuildProgress(Protocol):
    """What the pipeline reports while it builds."""

    def start(self, recipe: str, engine_dir: str) -> None: ...

    def stage_start(self, name: str) -> None: ...

    def stage_end(self, name: str, seconds: float, cached: bool) -> None: ...

    def info(self, message: str) -> None: ...

    def finish(self, summary: dict[str, Any]) -> None: ...


class QuietProgress:
    """Reports nothing (tests, --quiet)."""

    def start(self, recipe: str, engine_dir: str) -> None:
        pass

    def stage_start(self, name: str) -> None:
        pass

    def stage_end(self, name: str, seconds: float, cached: bool) -> None:
        pass

    def info(self, message: str) -> None:
        pass

    def finish(self, summary: dict[str, Any]) -> None:
        pass


class JsonProgress:
    """One JSON object per line on `stream` (stdout by default); the last line is the build summary."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or private_stdout()

    def _emit(self, **event: Any) -> None:
        self.stream.write(json.dumps(event, default=str) + "\n")
        self.stream.flush()

    def start(self, recipe: str, engine_dir: str) -> None:
        self._emit(event="start", recipe=recipe, engine_dir=engine_dir)

    def stage_start(self, name: str) -> None:
        self._emit(event="stage_start", stage=name)

    def stage_end(self, name: str, seconds: float, cached: bool) -> None:
        self._emit(event="stage_end", stage=name, seconds=round(seconds, 3), cached=cached)

    def info(self, message: str) -> None:
        self._emit(event="info", message=message)

    def finish(self, summary: dict[str, Any]) -> None:
        self._emit(event="done", **summary)


class RichProgress:
    """A spinner while a stage runs, then `✓ stage  1.23 s` (or `cached`)."""

    def __init__(self) -> None:
        from rich.console import Console

        # its own stdout: the spinner thread keeps drawing while a stage's output goes to the stage log
        self.console = Console(file=private_stdout(), highlight=False)
        self._status: Any = None

    def start(self, recipe: str, engine_dir: str) -> None:
        self.console.print(f"[bold]kiln build[/] {recipe} → {engine_dir}")

    def stage_start(self, name: str) -> None:
        self._status = self.console.status(f"{name} …")
        self._status.start()

    def stage_end(self, name: str, seconds: float, cached: bool) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        note = "[dim]cached[/]" if cached else ""
        self.console.print(f"  [green]✓[/] {name:<14} {seconds:7.2f} s  {note}")

    def info(self, message: str) -> None:
        self.console.print(f"  {message}")

    def finish(self, summary: dict[str, Any]) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if summary.get("dry_run"):
            self.console.print("[yellow]dry run[/]: nothing written")
        elif summary.get("cached"):
            self.console.print(
                f"[green]up to date[/]: {summary['engine_dir']} (no work, {summary['seconds']:.2f} s)"
            )
        else:
            self.console.print(f"[green]built[/] {summary['engine_dir']} in {summary['seconds']:.2f} s")


def make_progress(mode: ProgressMode = "rich") -> BuildProgress:
    if mode == "quiet":
        return QuietProgress()
    if mode == "json":
        return JsonProgress()
    return RichProgress()
