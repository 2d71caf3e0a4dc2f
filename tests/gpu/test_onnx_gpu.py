"""onnxruntime-gpu options for the ONNX engine: CUDA EP, or TensorRT EP with caches and profiles from the recipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from llmkiln.build.onnx_gpu import (
    EP_CONTEXT_MODEL,
    TRT_CACHE_DIR,
    build_trt_engine,
    dim_ranges,
    onnx_gpu_status,
    profile_shapes,
    provider_options,
)
from llmkiln.recipe import load_recipe


@pytest.fixture()
def recipe():
    r, _ = load_recipe("tiny-fp32", overrides={"scheduler": {"max_batch_size": 4, "max_prefill_tokens": 128}})
    return r


@pytest.fixture()
def engine_dir(tmp_path: Path) -> Path:
    """A graph with the builder's input signature (no weights: only the signature matters here)."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]
        ),
        helper.make_tensor_value_info(
            "past_key_values.0.key",
            TensorProto.FLOAT,
            ["batch_size", 4, "past_sequence_length", "kv_cache_dim"],
        ),
    ]
    out = helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch_size", "sequence_length"])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["ids_out"])], "g", inputs, [out])
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"head_size": 8}}}))
    return tmp_path


def test_profile_shapes_cover_every_dynamic_input_from_the_recipe_limits(engine_dir: Path, recipe) -> None:
    shapes = profile_shapes(engine_dir / "model.onnx", recipe)
    b, s, i = 4, recipe.limits.max_seq_len, recipe.limits.max_input_len
    assert (
        shapes["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1,past_key_values.0.key:1x4x0x8"
    )
    assert (
        shapes["trt_profile_opt_shapes"]
        == f"input_ids:1x128,attention_mask:1x128,past_key_values.0.key:1x4x{s}x8"
    )
    assert (
        shapes["trt_profile_max_shapes"]
        == f"input_ids:{b}x{i},attention_mask:{b}x{s},past_key_values.0.key:{b}x4x{s}x8"
    )
    assert dim_ranges(recipe, 8)["kv_cache_dim"] == (8, 8, 8)


def test_tensorrt_provider_options(engine_dir: Path, recipe) -> None:
    providers = provider_options(recipe, engine_dir, "tensorrt", cuda_graph=True)
    assert [p for p, _ in providers] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    trt = providers[0][1]
    assert trt["trt_engine_cache_enable"] is True and trt["trt_timing_cache_enable"] is True
    assert trt["trt_cuda_graph_enable"] is True
    assert trt["trt_engine_cache_path"] == str(engine_dir / TRT_CACHE_DIR)
    assert trt["trt_ep_context_file_path"] == str(engine_dir / EP_CONTEXT_MODEL)
    for k in ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"):
        assert trt[k].startswith("input_ids:")
    assert provider_options(recipe, engine_dir, "cuda") == [("CUDAExecutionProvider", {"device_id": 0})]


@pytest.mark.torch
def test_gating_never_reads_onnxruntimes_provider_list(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    def boom() -> list[str]:
        raise AssertionError("gating must not consult onnxruntime.get_available_providers()")

    monkeypatch.setattr(onnxruntime, "get_available_providers", boom)
    status = onnx_gpu_status()
    import torch

    assert status.cuda == torch.cuda.is_available()
    if not status.cuda:
        assert not status.ok("cuda") and not status.ok("tensorrt")
        assert any("CUDA" in m for m in status.missing)


def test_onnxruntime_and_onnxruntime_gpu_are_separate_extras(repo_root: Path) -> None:
    import tomllib

    extras = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {k: {d.split("==")[0].split("[")[0] for d in v} for k, v in extras.items()}
    assert "onnxruntime" in names["cpu"] and "onnxruntime-gpu" not in names["cpu"]
    assert "onnxruntime-gpu" in names["gpu"] and "onnxruntime" not in names["gpu"]


@pytest.mark.slow
def test_tensorrt_ep_builds_the_engine_ahead_of_time(engine_factory) -> None:
    status = onnx_gpu_status()
    if not status.ok("tensorrt"):
        pytest.skip("needs a GPU host with onnxruntime-gpu and TensorRT: " + "; ".join(status.missing))
    engine = engine_factory("tiny-fp32")
    r, _ = load_recipe("tiny-fp32")
    info = build_trt_engine(r, engine)
    assert info["providers"][0] == "TensorrtExecutionProvider"
    assert any(f.endswith(".engine") for f in info["cache_files"])
    assert (engine / EP_CONTEXT_MODEL).is_file()


@pytest.mark.slow
def test_an_onnx_gpu_engine_records_its_providers_and_never_runs_on_the_cpu(engine_factory) -> None:
    """The build writes the providers= list the runner uses (TensorRT EP on the built cache, CUDA EP); where this
    onnxruntime has neither, loading the engine is exit 3 (NeedsGpuHost), not a silent run on the CPU EP."""
    from llmkiln.engine_dir import EXECUTION_PROVIDERS, EngineDir
    from llmkiln.errors import NeedsGpuHost
    from llmkiln.runtime.loader import load_engine

    engine = engine_factory("tiny-onnx-gpu")
    stored = json.loads((engine / EXECUTION_PROVIDERS).read_text())
    assert [name for name, _ in stored] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert (
        stored[0][1]["trt_engine_cache_path"] == TRT_CACHE_DIR
    )  # relative: the folder is renamed into place
    providers = EngineDir(engine).execution_providers()
    assert providers is not None
    trt = providers[0][1]
    assert (
        trt["trt_engine_cache_path"] == str(engine / TRT_CACHE_DIR) and not trt["trt_dump_ep_context_model"]
    )
    assert EngineDir(engine_factory("tiny-fp32")).execution_providers() is None  # CPU engines: the CPU EP
    if onnx_gpu_status().ok("cuda"):
        eng = load_engine(engine)  # a GPU host: the engine's providers, first one in use
        try:
            assert eng.runner.session.get_providers()[0] in (
                "TensorrtExecutionProvider",
                "CUDAExecutionProvider",
            )
        finally:
            eng.shutdown(5)
        return
    with pytest.raises(NeedsGpuHost, match="backend onnx-gpu"):
        load_engine(engine)


@pytest.mark.slow
def test_an_onnx_gpu_engine_generates_on_a_gpu_host(engine_factory) -> None:
    status = onnx_gpu_status()
    if not status.ok("tensorrt"):
        pytest.skip("needs a GPU host with onnxruntime-gpu and TensorRT: " + "; ".join(status.missing))
    r = subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", "generate", str(engine_factory("tiny-onnx-gpu")), "Hello",
         "--max-tokens", "8"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


class FakeSession:
    """What onnxruntime leaves after an execution provider failed to load: a session with fewer providers."""

    def __init__(self, registered: list[str]) -> None:
        self.registered = registered
        self.fallback_disabled = False

    def get_providers(self) -> list[str]:
        return self.registered

    def disable_fallback(self) -> None:
        self.fallback_disabled = True


TRT_AND_CUDA = [("TensorrtExecutionProvider", {"device_id": 0}), ("CUDAExecutionProvider", {"device_id": 0})]


@pytest.mark.parametrize(
    ("registered", "missing", "library"),
    [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], ["TensorrtExecutionProvider"], "libnvinfer"),
        (["CPUExecutionProvider"], ["TensorrtExecutionProvider", "CUDAExecutionProvider"], "libcudnn"),
    ],
)
def test_the_runner_refuses_a_session_that_fell_back(
    tmp_path: Path, registered: list[str], missing: list[str], library: str
) -> None:
    """onnxruntime drops an EP whose library does not load and runs on the CPU EP without an error: the runner
    reads session.get_providers() and refuses (exit 3), naming the missing provider and its library."""
    from llmkiln.errors import NeedsGpuHost
    from llmkiln.runtime.runner import check_session_providers

    with pytest.raises(NeedsGpuHost) as err:
        check_session_providers(FakeSession(registered), TRT_AND_CUDA, tmp_path / "model.onnx")
    assert err.value.exit_code == 3
    assert f"{', '.join(missing)} did not load" in str(err.value)
    assert library in str(err.value) and "registered only " + ", ".join(registered) in str(err.value)


def test_the_runner_keeps_a_session_with_every_provider_and_switches_run_fallback_off(tmp_path: Path) -> None:
    from llmkiln.runtime.runner import check_session_providers

    full = FakeSession(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    check_session_providers(full, TRT_AND_CUDA, tmp_path / "model.onnx")
    assert full.fallback_disabled  # an EP failure in run() raises instead of moving to the CPU EP
    cpu = FakeSession(["CPUExecutionProvider"])
    check_session_providers(cpu, None, tmp_path / "model.onnx")  # a CPU engine: nothing to check
    assert not cpu.fallback_disabled


def test_onnx_runner_checks_the_session_it_created(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """OnnxRunner itself: onnxruntime offers the GPU providers, but the created session registered only the CPU
    EP (a CUDA library missing) -> NeedsGpuHost before anything runs."""
    import types

    from llmkiln.errors import NeedsGpuHost
    from llmkiln.runtime import runner

    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(runner.ort, "get_available_providers", lambda: available)
    monkeypatch.setattr(runner.ort, "InferenceSession", lambda *a, **k: FakeSession(["CPUExecutionProvider"]))
    info = types.SimpleNamespace(model_file="model.onnx", vocab_size=32, logits_name="logits")
    with pytest.raises(NeedsGpuHost, match="CUDAExecutionProvider"):
        runner.OnnxRunner(tmp_path, info, 1, 16, 16, 1 << 20, last_logits_only=False, providers=TRT_AND_CUDA)  # type: ignore[arg-type]


def test_the_trt_engine_build_refuses_when_the_tensorrt_ep_did_not_load(
    monkeypatch: pytest.MonkeyPatch, engine_dir: Path, recipe
) -> None:
    import onnxruntime

    from llmkiln.build import onnx_gpu
    from llmkiln.errors import NeedsGpuHost

    monkeypatch.setattr(onnx_gpu, "onnx_gpu_status", lambda: onnx_gpu.OnnxGpuStatus(True, True, True, ()))
    monkeypatch.setattr(
        onnxruntime,
        "InferenceSession",
        lambda *a, **k: FakeSession(["CUDAExecutionProvider", "CPUExecutionProvider"]),
    )
    with pytest.raises(NeedsGpuHost, match="TensorRT EP did not load"):
        build_trt_engine(recipe, engine_dir)
