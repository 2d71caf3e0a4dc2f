"""The calibration build stage: KV scales with the engine (manifest, sha256, runtime-readable, in the build key) and
the quality gate that refuses to publish an engine outside its budget."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from llmkiln.calibration.stage import CpuCalibrationStage
from llmkiln.errors import QualityBudgetExceeded
from llmkiln.recipe import load_recipe
from llmkiln.resources import bundled

STRICT = """\
name: {name}
backend: onnx-cpu
precision: int4
model:
  path: {model}
limits:
  max_input_len: 256
  max_seq_len: 512
calibration:
  dataset: calibration/stories-calib.jsonl
quality_budget:
  max_ppl_delta_pct: 1.0
  min_top1_agreement: 0.97
  samples: 4
  continuation_tokens: 4
"""


def _recipe(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_kv_scales_are_stored_listed_and_readable_by_the_runtime(engine_factory) -> None:
    from llmkiln.kv_scales import KvScales

    engine = engine_factory("stories-int8")
    manifest = json.loads((engine / "manifest.json").read_text())
    part = manifest["calibration"]["kv_scales"]
    path = engine / part["path"]
    assert part["path"] == "calibration/kv_scales.json" and part["dtype"] == "int8"
    assert part["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["engine_files"][part["path"]] == part["sha256"]
    assert part["sequences"] == 64
    scales = KvScales.read(path, num_layers=5, kv_heads=4)
    assert scales.dtype == "int8" and np.all(scales.scales > 0)
    effect = manifest["calibration"]["kv_store_effect"]
    assert 0 < effect["static"]["mean_kl"] < 0.01 and effect["static"]["top1_agreement"] > 0.97
    data = json.loads(path.read_text())
    np.testing.assert_allclose(np.asarray(data["k_absmax"]) / 127.0, scales.scales[:, 0], rtol=1e-6)


def test_calibration_set_contents_are_part_of_the_build_key(tmp_path: Path, stories_dir: Path) -> None:
    from llmkiln.build.build_cache import build_key

    for split in ("calib", "eval"):
        shutil.copyfile(bundled("calibration") / f"stories-{split}.jsonl", tmp_path / f"mine-{split}.jsonl")
    text = STRICT.format(name="keyed", model=stories_dir).replace(
        "calibration/stories-calib.jsonl", str(tmp_path / "mine-calib.jsonl")
    )
    recipe, _ = load_recipe(_recipe(tmp_path, "keyed", text))
    stage = CpuCalibrationStage()
    ctx = SimpleNamespace(recipe=recipe)
    before = build_key(recipe, {}, {}, [stage], ctx)
    with open(tmp_path / "mine-calib.jsonl", "a") as f:
        f.write(json.dumps({"id": "new", "text": "A new calibration story."}) + "\n")
    after = build_key(recipe, {}, {}, [stage], ctx)
    assert before != after
    assert stage.build_key_extra(ctx)["datasets"]["mine-calib.jsonl"] != ""


@pytest.mark.slow
def test_build_refuses_to_publish_outside_the_budget(tmp_path: Path, stories_dir: Path) -> None:
    from llmkiln.backends import build as build_engine

    recipe = _recipe(tmp_path, "strict-int4", STRICT.format(name="strict-int4", model=stories_dir))
    engines = tmp_path / "engines"
    with pytest.raises(QualityBudgetExceeded) as exc:
        build_engine(recipe, engines)
    msg = str(exc.value)
    assert "outside its quality budget" in msg and "not published" in msg and "stories-eval-" in msg
    assert not (engines / "strict-int4").exists()
    assert not list(engines.glob(".tmp-*"))
    kept = engines / ".quality" / "strict-int4" / "quality_report.md"
    assert kept.is_file() and "FAIL" in kept.read_text()

    result = build_engine(recipe, engines, allow_quality_regression=True)
    q = result.manifest["calibration"]["quality"]
    assert (engines / "strict-int4" / "model.onnx").is_file()
    assert not q["passed"] and q["regression_allowed"] and q["violations"]


@pytest.mark.slow
def test_kiln_calibrate_cpu_and_nothing_to_do(engine_factory, tmp_path: Path) -> None:
    from llmkiln.cli.main import main

    engine = engine_factory("stories-int8")
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "stories-int8", "--engine", str(engine), "--out", str(tmp_path / "c")])
    assert exc.value.code == 0
    ours = json.loads((tmp_path / "c" / "kv_scales.json").read_text())
    built = json.loads((engine / "calibration" / "kv_scales.json").read_text())
    assert ours["layers"] == built["layers"]  # same engine, same data: same scales
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "stories-fp32", "--out", str(tmp_path / "none")])
    assert exc.value.code == 2


@pytest.mark.slow
def test_trtllm_recipe_gates_the_fake_quant_model(tmp_path: Path) -> None:
    """A trtllm recipe with a quality budget: ModelOpt calibration + quality gate run on CPU; the build then stops
    for a GPU host. (On gpu-smoke-llama: stories260K's head size 8 is not one TensorRT-LLM's kernels run.)"""
    from llmkiln.backends import build as build_engine
    from llmkiln.errors import NeedsGpuHost

    recipe = tmp_path / "gated-smoke.yaml"
    recipe.write_text(
        "name: gated-smoke\nextends: tiny-trtllm-fp8\nquality_budget:\n  max_mean_kl: 0.05\n"
        "  min_top1_agreement: 0.5\n  samples: 8\n  continuation_tokens: 16\n"
    )
    engines = tmp_path / "engines"
    with pytest.raises(NeedsGpuHost):
        build_engine(recipe, engines)
    reports = list(engines.rglob("quality/quality_report.json"))
    assert len(reports) == 1
    data = json.loads(reports[0].read_text())
    assert data["passed"] and data["candidate_kind"] == "modelopt-fake-quant"
    assert data["summary"]["mean_kl"] > 1e-5 and data["summary"]["top1_agreement"] < 1.0


def test_stories_fp8_modelopt_is_calibration_only(tmp_path: Path, stories_dir: Path) -> None:
    """`kiln build` refuses it at once (exit 2, nothing written): stories260K cannot run on TensorRT-LLM."""
    from llmkiln.backends import build as build_engine
    from llmkiln.errors import BadInput

    with pytest.raises(BadInput, match="head size 8"):
        build_engine("stories-fp8-modelopt", tmp_path / "engines")
    assert not (tmp_path / "engines" / ".pending").exists()
