"""`kiln lint-prompts FILE.jsonl --engine ENGINE`: the prefix-cache hit rate the requests can reach, and why not
more."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.lint.lint import lint_prompts
from llmkiln.lint.render import render_report


@click.command("lint-prompts")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--engine", required=True, help="Engine folder, or a recipe name under the engines root.")
@engines_dir_option
@click.option(
    "--fix",
    "fix_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the normalized requests here (dynamic content moved after the shared part, ...).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--min-hit-rate",
    type=float,
    default=None,
    help="Exit 1 when the achievable token hit rate is below this fraction (0-1), for CI.",
)
@click.pass_context
def lint_prompts_cmd(
    ctx: click.Context,
    file: Path,
    engine: str,
    engines_dir: Path,
    fix_out: Path | None,
    as_json: bool,
    min_hit_rate: float | None,
) -> None:
    """Tokenize FILE's requests (JSONL: {"prompt": ...} or {"messages": [...]}) as ENGINE's server would, and
    report the prefix-cache hit rate they can reach and every cause that breaks sharing, with fixes."""
    if min_hit_rate is not None and not 0.0 <= min_hit_rate <= 1.0:
        raise BadInput(f"--min-hit-rate {min_hit_rate}: give a fraction between 0 and 1, e.g. 0.6")
    folder = resolve_engine(engine, engines_dir)
    report, _ = lint_prompts(file, folder, fix_out)
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        click.echo(render_report(report, min_hit_rate))
    if min_hit_rate is not None and report.baseline.token_hit_rate < min_hit_rate:
        ctx.exit(1)
