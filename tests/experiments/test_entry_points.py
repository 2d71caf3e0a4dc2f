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


@pytest.mark.parametrize("name", ["pd", "pd-threads2", "pd-192", "pd-open1.5", "pd-open1.5-192"])
def test_the_committed_pd_summaries_are_what_their_summary_json_gives(tmp_path, name):
    shutil.copytree(RESULTS / name, tmp_path / "p")
    assert run(pd.main, ["--resummarize", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "SUMMARY.md").read_text() == (RESULTS / name / "SUMMARY.md").read_text()


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


def test_pd_defaults_quote_p99_and_read_the_decode_workers_step_profile(tmp_path):
    """bench-pd runs >= 64 requests per closed-loop level with the conditional setup among the defaults, and reads
    a worker's step profile for one run's window (steps and requests outside it are left out)."""
    cfg = pd.PdConfig.make()
    assert cfg.requests >= 64 and "pd-1p1d-local128" in [s.name for s in cfg.setups]
    prof = tmp_path / "worker-1.jsonl"
    lines = [
        '{"kind":"start","pid":1,"t":0}',
        '{"kind":"step","t":50,"total_us":999000,"prefill":[[1,512,0,990000,["x"]]],"decode":null,"load_us":0}',
        '{"kind":"step","t":100,"total_us":20000,"prefill":[],"decode":[4,4,100,19000],"load_us":0}',
        '{"kind":"step","t":110,"total_us":40000,"prefill":[[1,16,2032,30000,["a"]]],"decode":null,"load_us":7000}',
        '{"kind":"step","t":120,"total_us":22000,"prefill":[],"decode":[4,4,101,21000],"load_us":0}',
        '{"kind":"request","id":"a","arrival":105,"prompt":2048,"cached":2032}',
        "{half a line",
    ]
    prof.write_text("\n".join(lines) + "\n")
    s = pd.step_stats(prof, [100, 200])
    assert s is not None and s["steps"] == 3
    assert s["decode_only_ms"]["n"] == 2 and s["with_prefill_ms"]["n"] == 1
    assert s["max_step_ms"] == 40.0 and s["max_load_ms"] == 7.0
    assert (s["computed_tokens"], s["max_computed_tokens"]) == (16, 16)
    assert pd.step_stats(tmp_path / "none.jsonl", [0, 1]) is None
