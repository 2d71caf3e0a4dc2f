"""One `--engines-dir` (llmkiln/cli/options.py) on every command that finds or writes engine folders, and each
honours `$LLMKILN_ENGINES` when the option is not given (no command hard-codes ./engines)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from llmkiln.cli import options
from llmkiln.cli.main import cli, main
from llmkiln.engine_dir import ENGINES_ENV

# every command that takes an ENGINE / recipe and its engines root (a new one joins by using the shared option)
EXPECTED = {
    "build",
    "generate",
    "verify",
    "lint-prompts",
    "diagnose",
    "deploy dynamo",
    "calibrate",
    "bench soak",
    "profile",
}


def _commands(group: click.Group, ctx: click.Context, prefix: str = ""):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        path = f"{prefix}{name}"
        yield path, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, ctx, f"{path} ")


def engine_commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    return {
        path: cmd for path, cmd in _commands(cli, ctx) if any(p.name == "engines_dir" for p in cmd.params)
    }


def _required_args(cmd: click.Command, dummy: str) -> list[str]:
    """The least command line make_context accepts: each required argument and option given `dummy`."""
    args: list[str] = []
    for p in cmd.params:
        if isinstance(p, click.Option) and p.required:
            args += [p.opts[0], dummy]
    for p in cmd.params:
        if isinstance(p, click.Argument) and p.required:
            args.append(dummy)
    return args


def parsed_engines_dir(cmd: click.Command, argv: list[str]) -> Path:
    with cmd.make_context(cmd.name, list(argv)) as ctx:  # click consumes the list
        return ctx.params["engines_dir"]


def test_every_engine_command_takes_the_one_shared_option():
    found = engine_commands()
    assert set(found) >= EXPECTED, EXPECTED - set(found)
    for path, cmd in found.items():
        (param,) = [p for p in cmd.params if p.name == "engines_dir"]
        assert param.callback is options._engines_root, f"kiln {path}: its own --engines-dir"
        assert param.default is None and param.opts == ["--engines-dir"], path


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_engines_env_is_the_default_and_the_option_wins(path, tmp_path, monkeypatch):
    cmd = engine_commands()[path]
    base = _required_args(cmd, str(tmp_path / "absent"))  # parsed only, never opened
    monkeypatch.setenv(ENGINES_ENV, str(tmp_path / "from-env"))
    assert parsed_engines_dir(cmd, base) == tmp_path / "from-env"
    assert parsed_engines_dir(cmd, [*base, "--engines-dir", str(tmp_path / "given")]) == tmp_path / "given"
    monkeypatch.delenv(ENGINES_ENV)
    assert parsed_engines_dir(cmd, base) == Path("engines")


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "nope"],
        ["generate", "nope", "hi"],
        ["lint-prompts", "{file}", "--engine", "nope"],
        ["diagnose", "--engine", "nope"],
        ["bench", "soak", "nope"],
        ["profile", "nope"],
    ],
)
def test_a_recipe_name_is_looked_up_under_the_env_root(argv, tmp_path, monkeypatch, capsys):
    """The resolver is the one of llmkiln.engine_dir: a missing engine names the folder it looked in."""
    root = tmp_path / "engines-from-env"
    root.mkdir()
    requests = tmp_path / "r.jsonl"
    requests.write_text('{"prompt": "hi"}\n')
    monkeypatch.setenv(ENGINES_ENV, str(root))
    with pytest.raises(SystemExit) as exc:
        main([a.replace("{file}", str(requests)) for a in argv])
    assert exc.value.code == 2
    assert str(root / "nope") in capsys.readouterr().err
