"""`kiln` root: registers command modules lazily and maps library exceptions to messages and exit codes.

Exit codes: 0 ok, 1 failure (incl. quality budget exceeded), 2 bad input, 3 needs a GPU host.
Set LLMKILN_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click

from llmkiln.errors import BadInput, KilnError
from llmkiln.recipe import RECIPES_ENV

# command name -> "module:attribute" (imported only when the command runs, so `kiln --help` stays fast)
COMMANDS: dict[str, str] = {
    "build": "llmkiln.cli.build_cmd:build",
    "recipes": "llmkiln.cli.recipe_cmd:recipes",
    "recipe": "llmkiln.cli.recipe_cmd:recipe",
    "model": "llmkiln.cli.model_cmd:model",
    "generate": "llmkiln.cli.generate_cmd:generate",
    "repo": "llmkiln.cli.serve_cmd:repo",
    "serve": "llmkiln.cli.serve_cmd:serve",
    "deploy": "llmkiln.cli.deploy_cmd:deploy",
    "bench": "llmkiln.cli.bench_cmd:bench",
    "profile": "llmkiln.cli.profile_cmd:profile",
    "quality-diff": "llmkiln.cli.quality_cmd:quality_diff",
    "calibrate": "llmkiln.cli.quality_cmd:calibrate",
    "lint-prompts": "llmkiln.cli.lint_cmd:lint_prompts_cmd",
    "diagnose": "llmkiln.cli.diagnose_cmd:diagnose",
    "verify": "llmkiln.cli.verify_cmd:verify",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                raise click.ClickException(
                    f"command {cmd_name!r} is not available ({module_name} missing)"
                ) from exc
            raise
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmkiln")
@click.option(
    "--recipes-dir",
    "recipes_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"A folder of recipes searched before ./recipes and the bundled ones (repeatable; also ${RECIPES_ENV}).",
)
def cli(recipes_dirs: tuple[Path, ...]) -> None:
    """llmkiln: build an untouched LLM checkpoint into a served engine with lower time-to-first-token."""
    if recipes_dirs:
        for d in recipes_dirs:
            if not d.is_dir():
                raise BadInput(f"--recipes-dir {d}: no such folder")
        # The environment carries it to every process kiln starts (servers, bench builds).
        current = [p for p in os.environ.get(RECIPES_ENV, "").split(os.pathsep) if p]
        os.environ[RECIPES_ENV] = os.pathsep.join([*(str(d.resolve()) for d in recipes_dirs), *current])


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="kiln")


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> None:
    """Run a click command with kiln's exit codes and error messages (also the experiments' entry points)."""
    try:
        rv = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except KilnError as exc:
        if os.environ.get("LLMKILN_DEBUG"):
            raise
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
