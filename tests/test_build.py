"""The build pipeline: engine layout, manifest, build cache (no-op, --force, changed field), atomic publish."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmkiln import backends
from llmkiln.backends import STAGES
from llmkiln.backends import build as build_engine
from llmkiln.build import weights
from llmkiln.errors import BuildFailed
from llmkiln.recipe import load_raw, recipe_path

pytestmark = pytest.mark.slow

ENGINE_FILES = {
    "model.onnx",
    "model.onnx.data",
    "genai_config.json",
    "tokenizer.json",
    "recipe.resolved.yaml",
}


def write_variant(
    folder: Path, name: str, stories_dir: Path, base: str = "stories-fp32", **sections: dict
) -> Path:
    """A recipe file `name` = the merged `base` recipe with some sections changed (model path made absolute)."""
    data = load_raw(recipe_path(base))
    data.update(name=name, model={"path": str(stories_dir)})
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_engine_layout_and_manifest(engine_factory, stories_dir: Path) -> None:
    engine = engine_factory("stories-fp32")
    names = {p.name for p in engine.iterdir()}
    assert ENGINE_FILES | {"manifest.json"} <= names
    m = json.loads((engine / "manifest.json").read_text())
    assert m["recipe"] == "stories-fp32" and m["backend"] == "onnx-cpu" and m["precision"] == "fp32"
    assert m["source"]["weights"] == {"model.safetensors": _sha(stories_dir / "model.safetensors")}
    for rel, digest in m["engine_files"].items():
        assert _sha(engine / rel) == digest, rel
    assert set(m["engine_files"]) == names - {"manifest.json"}
    for tool in ("onnxruntime", "onnxruntime-genai", "transformers", "python"):
        assert tool in m["tool_versions"]
    assert [s["name"] for s in m["stages"]] == [
        "export",
        "tokenizer",
        "warmup-check",
        "calibration",
    ]  # calibration: skipped for fp32
    assert m["build_seconds"] > 0 and len(m["recipe_sha256"]) == 64
    assert m["export"]["op_counts"]["GroupQueryAttention"] == 5
    resolved = yaml.safe_load((engine / "recipe.resolved.yaml").read_text())
    assert resolved["name"] == "stories-fp32" and resolved["limits"]["max_seq_len"] == 512
    # tokenizer files are the source's, byte for byte
    assert _sha(engine / "tokenizer.json") == _sha(stories_dir / "tokenizer.json")


def test_cache_noop_force_and_changed_field(tmp_path: Path, stories_dir: Path, monkeypatch) -> None:
    # The cache mechanics only: the export and tokenizer stages (the int8 variant below would otherwise also run
    # the calibration room's quality gate, which has its own tests).
    monkeypatch.setitem(STAGES, "onnx-cpu", STAGES["onnx-cpu"][:2])
    engines = tmp_path / "engines"
    recipe = write_variant(tmp_path, "cache-a", stories_dir)
    first = build_engine(recipe, engines)
    assert not first.cached
    manifest_mtime = (first.engine_dir / "manifest.json").stat().st_mtime_ns

    second = build_engine(recipe, engines)
    assert second.cached and second.manifest["build_key"] == first.manifest["build_key"]
    assert (second.engine_dir / "manifest.json").stat().st_mtime_ns == manifest_mtime

    forced = build_engine(recipe, engines, force=True)
    assert not forced.cached and not forced.manifest["stages"][0]["cached"]

    # a runtime field changes: the engine rebuilds, the export is reused from the stage cache
    write_variant(tmp_path, "cache-a", stories_dir, scheduler={"max_batch_size": 3})
    changed = build_engine(recipe, engines)
    assert not changed.cached
    assert changed.manifest["recipe_sha256"] != first.manifest["recipe_sha256"]
    assert changed.manifest["stages"][0] == {
        **changed.manifest["stages"][0],
        "name": "export",
        "cached": True,
    }
    assert (
        yaml.safe_load((changed.engine_dir / "recipe.resolved.yaml").read_text())["scheduler"][
            "max_batch_size"
        ]
        == 3
    )

    # a second recipe differing only in runtime fields shares the export (same stage key, same files)
    other = build_engine(write_variant(tmp_path, "cache-b", stories_dir, warmup={"count": 2}), engines)
    assert other.manifest["stages"][0]["cached"]
    assert other.manifest["stages"][0]["key"] == changed.manifest["stages"][0]["key"]
    assert _sha(other.engine_dir / "model.onnx.data") == _sha(changed.engine_dir / "model.onnx.data")

    # a build-relevant field (precision) re-exports
    write_variant(tmp_path, "cache-a", stories_dir, precision="int8")
    requant = build_engine(recipe, engines)
    assert not requant.cached and not requant.manifest["stages"][0]["cached"]
    assert "MatMulNBits" in requant.manifest["export"]["op_counts"]


class FailingStage:
    """A stage that fails after the export wrote its files (an interrupted build)."""

    name = "explode"
    version = "1"
    cacheable = False

    def cache_key(self, ctx) -> dict:
        return {}

    def run(self, ctx, out_dir: Path) -> dict:
        assert (out_dir / "model.onnx").is_file()
        raise BuildFailed("boom")


def test_failed_build_leaves_no_engine_folder(tmp_path: Path, stories_dir: Path, monkeypatch) -> None:
    engines = tmp_path / "engines"
    recipe = write_variant(tmp_path, "fails", stories_dir)
    monkeypatch.setitem(STAGES, "onnx-cpu", [*STAGES["onnx-cpu"], FailingStage()])
    with pytest.raises(BuildFailed, match="boom"):
        build_engine(recipe, engines)
    assert not (engines / "fails").exists()
    assert not list(engines.glob(".tmp-*"))


class InterruptedStage(FailingStage):
    def run(self, ctx, out_dir: Path) -> dict:
        raise KeyboardInterrupt


def test_interrupted_build_cleans_up_and_stale_temp_folders_go(
    tmp_path: Path, stories_dir: Path, monkeypatch
) -> None:
    engines = tmp_path / "engines"
    recipe = write_variant(tmp_path, "ctrl-c", stories_dir)
    with monkeypatch.context() as m:
        m.setitem(STAGES, "onnx-cpu", [*STAGES["onnx-cpu"], InterruptedStage()])
        with pytest.raises(KeyboardInterrupt):
            build_engine(recipe, engines)
    assert not (engines / "ctrl-c").exists() and not list(engines.glob(".tmp-*"))
    # a folder left by a killed build (SIGKILL: no cleanup) is removed by the next build of that recipe
    (engines / ".tmp-ctrl-c@killed").mkdir()
    (engines / ".tmp-ctrl-c-other@live").mkdir()  # another recipe's: untouched
    build_engine(recipe, engines)
    assert not (engines / ".tmp-ctrl-c@killed").exists() and (engines / ".tmp-ctrl-c-other@live").exists()


def test_failed_rebuild_keeps_the_previous_engine(tmp_path: Path, stories_dir: Path, monkeypatch) -> None:
    engines = tmp_path / "engines"
    recipe = write_variant(tmp_path, "keeps", stories_dir)
    good = build_engine(recipe, engines)
    before = (good.engine_dir / "manifest.json").read_text()
    monkeypatch.setitem(STAGES, "onnx-cpu", [*STAGES["onnx-cpu"], FailingStage()])
    with pytest.raises(BuildFailed):
        build_engine(recipe, engines, force=True)
    assert (good.engine_dir / "manifest.json").read_text() == before
    assert not list(engines.glob(".tmp-*")) and not list(engines.glob(".old-*"))


def test_model_override_replaces_the_recipe_model(tmp_path: Path, stories_dir: Path) -> None:
    result = build_engine("tiny-fp32", tmp_path / "engines", model_override=stories_dir)
    assert result.manifest["source"]["path"] == str(stories_dir.resolve())
    assert "generated" not in result.manifest["source"]
    assert result.manifest["source"]["weights"] == {
        "model.safetensors": _sha(stories_dir / "model.safetensors")
    }
    assert not (tmp_path / "engines" / ".models").exists()


class NoisyStage(FailingStage):
    name = "noisy"

    def run(self, ctx, out_dir: Path) -> dict:
        print("python stdout")
        print("python stderr", file=sys.stderr)
        os.write(1, b"fd 1\n")
        os.write(2, b"fd 2\n")
        return {}


def test_stage_output_goes_to_the_stage_log(tmp_path: Path, stories_dir: Path, monkeypatch, capfd) -> None:
    engines = tmp_path / "engines"
    monkeypatch.setitem(STAGES, "onnx-cpu", [*STAGES["onnx-cpu"], NoisyStage()])
    build_engine(write_variant(tmp_path, "noisy", stories_dir), engines)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    log = (engines / ".logs" / "noisy" / "noisy.log").read_text()
    assert all(line in log for line in ("python stdout", "python stderr", "fd 1", "fd 2"))


def test_dry_run_writes_nothing(tmp_path: Path, stories_dir: Path) -> None:
    engines = tmp_path / "engines"
    result = build_engine(write_variant(tmp_path, "dry", stories_dir), engines, dry_run=True)
    assert result.dry_run and not result.cached
    assert [s["name"] for s in result.manifest["plan"]] == [
        "export",
        "tokenizer",
        "warmup-check",
        "calibration",
    ]
    assert not engines.exists()


def test_source_hashes_read_every_file_every_time(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"\x00" * 1000)
    (src / "config.json").write_text("{}")
    first = weights.hash_model_dir(src)
    calls = []
    real = weights.sha256_file
    monkeypatch.setattr(weights, "sha256_file", lambda p: calls.append(p.name) or real(p))
    assert weights.hash_model_dir(src) == first and sorted(calls) == ["config.json", "model.safetensors"]
    assert first["model.safetensors"] == hashlib.sha256(b"\x00" * 1000).hexdigest()


def test_cli_build_json_then_up_to_date(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(tmp_path, "cli", stories_dir)
    argv = [
        sys.executable,
        "-m",
        "llmkiln.cli.main",
        "build",
        str(recipe),
        "--engines-dir",
        str(tmp_path / "e"),
        "--json",
    ]
    first = subprocess.run(argv, capture_output=True, text=True, check=True)
    events = [json.loads(line) for line in first.stdout.splitlines()]
    assert [e["stage"] for e in events if e["event"] == "stage_end"] == [
        "export",
        "tokenizer",
        "warmup-check",
        "calibration",
    ]
    assert events[-1]["event"] == "done" and events[-1]["cached"] is False
    second = subprocess.run(argv, capture_output=True, text=True, check=True)
    done = json.loads(second.stdout.splitlines()[-1])
    assert done["cached"] is True
    rich = subprocess.run(argv[:-1], capture_output=True, text=True, check=True)
    assert "up to date" in rich.stdout


def test_unknown_stage_backend_is_an_error() -> None:
    with pytest.raises(BuildFailed, match="no build stages"):
        backends.stages_for("no-such-backend")
