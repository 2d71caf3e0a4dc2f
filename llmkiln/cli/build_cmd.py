"""`kiln build RECIPE`: build (or find up to date) engines/<recipe>/ from a recipe."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from llmkiln.backends import build as build_engine
from llmkiln.build.progress import make_progress
from llmkiln.cli.options import engines_dir_option
from llmkiln.trtllm.resume import resume_build


@click.command()
@click.argument("recipe", required=False)
@click.option(
    "--resume",
    "resume_plan",
    type=click.Path(path_type=Path),
    default=None,
    help="Finish a trtllm build on a GPU host from its plan file (engines/.pending/<recipe>/plan.json).",
)
@click.option(
    "--force", is_flag=True, help="Rebuild even when the engine is up to date (ignores stage caches)."
)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines (one per stage, then a summary).")
@click.option(
    "--model",
    type=click.Path(path_type=Path),
    default=None,
    help="Use this local HF folder instead of the recipe's model.",
)
@engines_dir_option
@click.option(
    "--allow-quality-regression",
    is_flag=True,
    help="Publish a quantized engine even when it is outside the recipe's quality budget.",
)
@click.option(
    "--dry-run", is_flag=True, help="Show what would be built (stage keys, cache hits); write nothing."
)
def build(
    recipe: str | None,
    resume_plan: Path | None,
    force: bool,
    quiet: bool,
    as_json: bool,
    model: Path | None,
    engines_dir: Path,
    allow_quality_regression: bool,
    dry_run: bool,
) -> None:
    """Build the engine for RECIPE (a recipe name, see `kiln recipes`, or a path to a YAML file)."""
    if resume_plan is not None:
        done = resume_build(resume_plan)
        if not quiet:
            click.echo(f"engine ready: {done.engine_dir} ({done.seconds:.0f} s)")
        return
    if recipe is None:
        raise click.UsageError("give a RECIPE (or --resume PLAN)")
    progress = make_progress("json" if as_json else "quiet" if quiet else "rich")
    # SIGTERM (e.g. a CI timeout) unwinds like Ctrl-C, so the pipeline removes its temp folder.
    signal.signal(signal.SIGTERM, _interrupt)
    result = build_engine(
        recipe,
        engines_dir,
        force=force,
        model_override=model,
        progress=progress,
        dry_run=dry_run,
        allow_quality_regression=allow_quality_regression,
    )
    if result.dry_run and not quiet:
        click.echo(json.dumps(result.manifest, indent=2) if as_json else _plan_text(result.manifest))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _plan_text(plan: dict) -> str:
    lines = [f"recipe {plan['recipe']}: {'up to date' if plan['up_to_date'] else 'would build'}"]
    for stage in plan["plan"]:
        state = "cached" if stage["cached"] else "would run"
        lines.append(f"  {stage['name']:<14} {state:<10} key {stage['key'][:16]}")
        if stage.get("describe"):
            lines.append(stage["describe"])
    return "\n".join(lines)
