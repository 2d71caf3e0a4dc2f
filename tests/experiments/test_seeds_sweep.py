"""experiments.seeds_sweep: bad arguments exit 2 naming the option; a tiny real sweep (stories-ov-fp32 served by
`kiln serve --dynamo`, two levels, both workloads, cold and warm) writes one report per cell and a table whose
cold shared-prefix runs start with an empty prefix cache."""

from __future__ import annotations

import json

import pytest

from experiments import seeds_sweep
from llmkiln.bench.report import load_report


def run(argv):
    with pytest.raises(SystemExit) as exc:
        seeds_sweep.main(argv)
    return exc.value.code


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--concurrency", "1,x"], "--concurrency"),
        (["--concurrency", "1,8", "--requests", "4"], "--requests"),
        (["--concurrency", "8", "--requests", "4"], "--requests"),
        (["--workloads", "mixed"], "--workloads"),
        (["--modes", "hot"], "--modes"),
        (["--warmup", "0"], "--warmup"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(tmp_path, capsys, extra, named):
    assert run(["--engine", str(tmp_path), "--out", str(tmp_path / "o"), *extra]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "o" / "SUMMARY.md").exists()


@pytest.mark.slow
def test_a_small_sweep_writes_a_report_per_cell_and_the_table(tmp_path, engine_factory):
    engine = engine_factory("stories-ov-fp32")
    out = tmp_path / "sweep"
    argv = ["--engine", str(engine), "--out", str(out), "--concurrency", "1,2", "--requests", "3,4"]
    argv += [
        "--warmup",
        "2",
        "--prompt-tokens",
        "150-200",
        "--system-tokens",
        "96",
        "--user-tokens",
        "10-20",
        "--output-tokens",
        "8",
        "--output-spread",
        "2",
    ]
    assert run(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["cells"]) == {"shared-prefix-warm", "shared-prefix-cold", "unique-warm", "unique-cold"}
    for cell, levels in summary["cells"].items():
        assert list(levels) == ["1", "2"], cell
        report = load_report(out / f"{cell}.json")
        errors = [e for lv in report.levels for e in lv.errors]
        assert [levels[c]["requests"] for c in ("1", "2")] == [3, 4], (cell, errors)
        assert not any(levels[c]["errors"] for c in levels), (cell, errors)
        assert report.run.mode == cell.rsplit("-", 1)[1] and [lv.concurrency for lv in report.levels] == [
            1,
            2,
        ]
    cells = summary["cells"]
    assert (
        cells["shared-prefix-warm"]["1"]["prefix_hit_rate"] > 0.8
    )  # the warm-up left the system prompt cached
    assert (
        cells["shared-prefix-cold"]["1"]["prefix_hit_rate"]
        < cells["shared-prefix-warm"]["1"]["prefix_hit_rate"]
    )
    assert cells["unique-warm"]["2"]["prefix_hit_rate"] < 0.2
    table = (out / "SUMMARY.md").read_text()
    assert "| shared-prefix | cold | 1 | 3 |" in table and summary["machine"]["cpu"]["model"] in table
