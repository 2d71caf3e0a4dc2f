"""experiments.cascade_steps: its shape options (the study itself needs a head-64 OpenVINO engine and a CPU
with AVX512-BF16; bench/results/cpu-speed-zen5/cascade-routing has its runs)."""

from __future__ import annotations

import click
import pytest

from experiments import cascade_steps


def test_the_shape_options_parse_and_bad_ones_name_the_format():
    assert cascade_steps._ints("500, 1000,") == (500, 1000)
    assert cascade_steps._turns("1x120,2x120") == ((1, 120), (2, 120))
    assert cascade_steps._turns("") == ()
    with pytest.raises(click.BadParameter, match="comma-separated token counts"):
        cascade_steps._ints("500,lots")
    with pytest.raises(click.BadParameter, match="comma-separated KxN"):
        cascade_steps._turns("2*120")
    with pytest.raises(click.BadParameter, match="K from 1 to 8 turns"):
        cascade_steps._turns("9x64")


def test_a_folder_that_is_no_engine_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cascade_steps.main(["--engine", str(tmp_path), "--history", "500", "--turns", "1x35"])
    assert exc.value.code != 0
    assert f"{tmp_path}: not an engine folder" in capsys.readouterr().err
