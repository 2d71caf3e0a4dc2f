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
    # stories260K: every tensor, no folding
    assert weights["tensors"] == 47 and weights["bit_identical"] == 47
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


def test_int8_weights_are_compressed_after_the_bit_for_bit_check_and_gated(
    tmp_path: Path, stories_dir: Path
) -> None:
    """`weights: int8` (fp32 compute: every CPU): the export checks the fp32 IR against the checkpoint, then NNCF
    compresses the linear layers to u8 (the token embedding and the MLP down projections kept); the quality gate
    scores the result; the engine generates; the checkpoint is not touched."""
    import openvino as ov

    before = {p.name: p.read_bytes() for p in stories_dir.iterdir() if p.is_file()}
    recipe = write_variant(
        tmp_path,
        "stories-ov-int8w",
        stories_dir,
        base="stories-ov-fp32",
        weights="int8",
        quality_budget={"max_ppl_delta_pct": 100.0, "min_top1_agreement": 0.5, "max_mean_kl": 1.0},
    )
    engines = tmp_path / "engines"
    fp32 = build_engine("stories-ov-fp32", engines)
    res = build_engine(str(recipe), engines)
    manifest = res.manifest
    stages = {s["name"]: s for s in manifest["stages"]}
    assert not stages["export"]["cached"], "an int8 IR is not the fp32 recipe's export"
    export = manifest["export"]
    assert export["weights"]["bit_identical"] == 47  # checked before compression
    comp = export["weight_compression"]
    # 5 layers x (q, k, v, o, gate, up); each layer's down projection kept
    assert comp["weights"] == "int8" and comp["compressed_tensors"] == 30
    kept = comp["kept_as_exported"]
    assert any("embedding" in n for n in kept["embedding"]) and kept["mlp_down_projections"] == 5
    assert comp["ir_bytes"] < comp["ir_bytes_before"] == fp32.manifest["export"]["ir_bytes"]
    model = ov.Core().read_model(str(EngineDir(res.engine_dir).openvino_model()))
    u8 = [
        op
        for op in model.get_ordered_ops()
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.u8
    ]
    assert len(u8) == 2 * 30  # each weight and its zero point
    quality = manifest["calibration"]["quality"]
    assert quality["passed"] and quality["summary"]["top1_agreement"] < 1.0, quality  # it ran on the int8 IR
    assert _kiln("verify", str(res.engine_dir)).returncode == 0

    from llmkiln.runtime.loader import load_engine

    with load_engine(res.engine_dir) as eng:
        out = eng.generate(["Once upon a time"])[0]
        assert eng.runtime_settings["weights"] == "int8"  # read off the IR (also /metrics' runtime settings)
    assert len(out) > 0
    assert {p.name: p.read_bytes() for p in stories_dir.iterdir() if p.is_file()} == before


def test_int8_weights_on_onnx_are_refused_naming_the_field(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(tmp_path, "onnx-int8w", stories_dir, base="stories-fp32", weights="int8")
    r = _kiln("build", str(recipe), "--engines-dir", str(tmp_path / "engines"))
    assert r.returncode == 2, r.stderr
    assert "weights: not used by backend onnx-cpu" in r.stderr and "precision: int8" in r.stderr
    assert not (tmp_path / "engines" / "onnx-int8w").exists()
