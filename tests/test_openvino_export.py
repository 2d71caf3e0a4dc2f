"""The openvino-cpu build: the IR holds every source weight bit for bit, `kiln verify` covers its files, bf16 is
gated by the quality diff like int8, and what the backend cannot take is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmkiln.backends import build as build_engine
from llmkiln.build.openvino_export import check_weights, export_openvino
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput, BuildFailed
from tests.conftest import CPU_BF16_INFO, HAS_BF16, requires_bf16
from tests.test_build import write_variant

pytestmark = pytest.mark.slow


def _kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True)


def test_the_ir_holds_the_source_weights_and_verify_covers_it(engine_factory) -> None:
    folder = EngineDir(engine_factory("stories-ov-fp32"))
    manifest = json.loads((folder.path / "manifest.json").read_text())
    assert manifest["backend"] == "openvino-cpu"
    weights = manifest["export"]["weights"]
    assert (
        weights["tensors"] == 47 and weights["bit_identical"] == 47
    )  # stories260K: every tensor, no folding
    assert {"openvino_model.xml", "openvino_model.bin", "genai_config.json"} <= set(manifest["engine_files"])
    assert _kiln("verify", str(folder.path)).returncode == 0


def test_a_changed_weight_is_a_build_failure(engine_factory, stories_dir: Path) -> None:
    import openvino as ov
    from safetensors.numpy import load_file

    model = ov.Core().read_model(str(EngineDir(engine_factory("stories-ov-fp32")).openvino_model()))
    source = load_file(str(stories_dir / "model.safetensors"))
    assert check_weights(model, source, stories_dir)["bit_identical"] == len(source)
    name = "model.layers.2.mlp.up_proj.weight"
    source[name] = np.nextafter(source[name], np.float32(np.inf))  # one ulp everywhere
    with pytest.raises(BuildFailed, match=name):
        check_weights(model, source, stories_dir)


@pytest.mark.skipif(
    HAS_BF16, reason=f"this CPU has bf16 arithmetic ({CPU_BF16_INFO}): the bf16 tests run instead"
)
def test_bf16_is_refused_on_a_cpu_without_it(tmp_path: Path) -> None:
    r = _kiln("build", "stories-ov-bf16", "--engines-dir", str(tmp_path / "engines"))
    assert r.returncode == 2, r.stderr
    assert "precision bf16 (backend openvino-cpu) needs a CPU with bf16 arithmetic" in r.stderr
    assert "fp32 sibling" in r.stderr
    assert not (tmp_path / "engines" / "stories-ov-bf16").exists()


@requires_bf16
def test_bf16_is_gated_by_the_quality_diff(engine_factory) -> None:
    folder = EngineDir(engine_factory("stories-ov-bf16"))
    quality = json.loads((folder.path / "manifest.json").read_text())["calibration"]["quality"]
    assert quality["passed"] and not quality["regression_allowed"], quality
    assert quality["summary"]["top1_agreement"] >= 0.97
    assert (folder.path / "calibration" / "quality" / "quality_report.md").is_file()


@requires_bf16
def test_a_bf16_engine_outside_its_budget_is_not_published(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(
        tmp_path,
        "stories-ov-bf16-strict",
        stories_dir,
        base="stories-ov-bf16",
        quality_budget={"max_mean_kl": 1e-9},
    )
    r = _kiln("build", str(recipe), "--engines-dir", str(tmp_path / "engines"))
    assert r.returncode == 1, r.stderr
    assert "mean KL" in r.stderr or "max_mean_kl" in r.stderr
    assert not (tmp_path / "engines" / "stories-ov-bf16-strict").exists()


def test_an_int8_kv_store_is_refused_naming_the_field(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(
        tmp_path, "ov-int8-kv", stories_dir, base="stories-ov-fp32", kv_cache={"dtype": "int8"}
    )
    r = _kiln("build", str(recipe), "--engines-dir", str(tmp_path / "engines"))
    assert r.returncode == 2, r.stderr
    assert "kv_cache.dtype" in r.stderr and "openvino-cpu" in r.stderr
    assert not (tmp_path / "engines" / "ov-int8-kv").exists()


def test_a_non_llama_model_is_refused(tmp_path: Path, stories_dir: Path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    cfg = json.loads((stories_dir / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(BadInput, match="model_type 'gpt2'"):
        export_openvino(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@requires_bf16
def test_fp32_and_bf16_share_one_export(tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    build_engine("stories-ov-fp32", engines)
    second = build_engine("stories-ov-bf16", engines)
    stages = {s["name"]: s for s in second.manifest["stages"]}
    assert stages["export"]["cached"], stages
