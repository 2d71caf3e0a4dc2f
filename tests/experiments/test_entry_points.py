"""The experiments' entry points (`python -m experiments.ttft`, `.scaleout`, `.pd`, `.cpu_peers`): kiln's exit
codes, and `--resummarize` reproducing the committed summaries from the committed reports (nothing measured)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import cpu_peers, pd, scaleout, ttft

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def run(main, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


def test_resummarize_needs_a_finished_run(tmp_path, capsys):
    assert run(ttft.main, ["--resummarize", "--out", str(tmp_path)]) == 2
    assert "summary.json" in capsys.readouterr().err
    assert run(scaleout.main, ["--resummarize", "--out", str(tmp_path)]) == 2
    assert run(pd.main, ["--resummarize", "--out", str(tmp_path)]) == 2
    assert run(cpu_peers.main, ["--resummarize", "--out", str(tmp_path)]) == 2
    assert run(ttft.main, ["--only", "nonsense"]) == 2


def test_the_committed_summary_is_what_its_saved_reports_give(tmp_path):
    """`--resummarize` on a copy of bench/results rewrites SUMMARY.md exactly as committed."""
    shutil.copytree(
        RESULTS, tmp_path / "r", ignore=shutil.ignore_patterns("raw", "scaleout", "pd*", "gpu", "*.png")
    )
    assert run(ttft.main, ["--resummarize", "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "SUMMARY.md").read_text() == (RESULTS / "SUMMARY.md").read_text()


def test_the_committed_scaleout_summary_is_what_its_summary_json_gives(tmp_path):
    shutil.copytree(RESULTS / "scaleout", tmp_path / "s")
    assert run(scaleout.main, ["--resummarize", "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "SUMMARY.md").read_text() == (RESULTS / "scaleout" / "SUMMARY.md").read_text()


def test_the_committed_pd_summary_is_what_its_summary_json_gives(tmp_path):
    shutil.copytree(RESULTS / "pd", tmp_path / "p")
    assert run(pd.main, ["--resummarize", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "SUMMARY.md").read_text() == (RESULTS / "pd" / "SUMMARY.md").read_text()


def test_run_as_modules_from_the_repository_root():
    """What the Makefile runs: `python -m experiments.ttft` (here only its help: nothing is measured)."""
    for module in ("experiments.ttft", "experiments.scaleout", "experiments.pd", "experiments.cpu_peers"):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert "--resummarize" in out.stdout and "--engines-dir" in out.stdout


@pytest.mark.parametrize("cli", [ttft.cli, scaleout.cli, pd.cli, cpu_peers.cli])
def test_the_shared_engines_dir_option_honours_the_env(cli, tmp_path, monkeypatch):
    from llmkiln.cli import options
    from llmkiln.engine_dir import ENGINES_ENV

    (param,) = [p for p in cli.params if p.name == "engines_dir"]
    assert param.callback is options._engines_root and param.default is None
    monkeypatch.setenv(ENGINES_ENV, str(tmp_path))
    with cli.make_context(cli.name, []) as ctx:
        assert ctx.params["engines_dir"] == tmp_path
