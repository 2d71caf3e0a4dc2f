"""experiments.cascade_steps: its shape options, and a quick study on the head-64 smoke model (the op needs a CPU
with AVX512-BF16; bench/results/cpu-speed-zen5/cascade-routing has full runs)."""

from __future__ import annotations

import json

import click
import pytest

from experiments import cascade_steps
from tests.conftest import requires_bf16
from tests.runtime.test_cascade_attention import RECIPE


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


@requires_bf16
def test_a_quick_study_runs_every_shape_on_a_small_engine(engine_factory, tmp_path):
    """The study end to end on the head-64 smoke model (a short prefix, one run per graph): every shape timed on
    both graphs, with the runner's routing and the logits' difference."""
    recipe = tmp_path / "cascade-test-ov-fp32.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    engine = engine_factory(str(recipe))
    out = tmp_path / "out"
    args = ["--engine", str(engine), "--prefix", "256", "--history", "100", "--own-prompts", "64"]
    args += ["--turns", "1x32,2x16", "--rounds", "1", "--runs", "1", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        cascade_steps.main(args)
    assert exc.value.code == 0
    data = json.loads((out / "cascade-steps.json").read_text())
    assert data["prefix"] == 256 and data["precision"] == "fp32"
    shapes = data["shapes"]
    assert {
        "8 decodes, shared prefix + 100 own tokens each",
        "7 decodes + a 64-token prompt of its own",
        "7 decodes + 1 x 32-token turns on the prefix",
        "6 decodes + 2 x 16-token turns on the prefix",
    } <= set(shapes)
    for shape in shapes.values():
        assert shape["paged_ms"] > 0 and shape["cascade_ms"] > 0 and shape["routed"] in ("paged", "cascade")
        assert shape["max_logit_difference"] <= 1e-3 * max(1.0, shape["logit_scale"])
    assert shapes["8 decodes, distinct prefixes"]["routed"] == "paged"
    assert shapes["8 decodes, shared prefix"]["routed"] == "cascade"
