"""`kiln verify ENGINE`: re-hash every file of an engine folder against its manifest, and an imported model's
source (its GGUF and the converted weights in the model cache) against the provenance the manifest records."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.build.model_import import verify_import
from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import IntegrityError


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
    manifest = folder.manifest()
    package = manifest.source.package if manifest is not None else None
    if package:
        problems = verify_import(package)
        if problems:
            raise IntegrityError("; ".join(problems))
        where = Path(str(package.get("import_dir", "")))
        state = "source re-hashed" if where.is_dir() else "import folder no longer cached: not re-hashed"
        click.echo(
            f"source: {package.get('name')}=={package.get('version')} {package.get('gguf_file')} "
            f"(GGUF sha256 {str(package.get('gguf_sha256'))[:16]}…), dequantized to fp32 ({state})"
        )
