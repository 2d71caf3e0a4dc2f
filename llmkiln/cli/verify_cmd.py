"""`kiln verify ENGINE`: re-hash every file of an engine folder against its manifest."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import resolve_engine


@click.command()
@click.argument("engine")
@engines_dir_option
def verify(engine: str, engines_dir: Path) -> None:
    """Check every file of ENGINE against the sha256 its manifest records (all files re-read).

    Exit 0 when all match; 1 naming each missing or changed file; 2 when ENGINE is not an engine folder.
    """
    folder = resolve_engine(engine, engines_dir).require()
    report = folder.verify()
    click.echo(
        f"ok: {folder.path}: {report.files} files match the manifest "
        f"({report.bytes / 1e6:.1f} MB hashed in {report.seconds:.2f} s)"
    )
