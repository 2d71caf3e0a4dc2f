"""GPU host only (CUDA + tensorrt_llm, in the pinned container of llmkiln/trtllm/pins.json): the real engine
build of tiny-trtllm-fp8, its engine folder, and the tensorrtllm model set served by tritonserver.

Skips here with the reason from gpu_status(). Serving also needs the upstream python model files
(the container's /app/all_models/inflight_batcher_llm, or LLMKILN_TRTLLM_MODELS) and `tritonserver`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from llmkiln.serve.server import free_ports
from llmkiln.trtllm.repo_check import check_trtllm_repository
from llmkiln.trtllm.upstream import container_folder

pytestmark = [pytest.mark.slow, pytest.mark.gpu]


@pytest.fixture(scope="module")
def gpu_engine(gpu_host, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmkiln.backends import build as build_engine
    from llmkiln.build.progress import QuietProgress

    root = tmp_path_factory.mktemp("gpu-engines")
    return build_engine("tiny-trtllm-fp8", root, progress=QuietProgress()).engine_dir


def test_engine_folder(gpu_engine: Path) -> None:
    cfg = json.loads((gpu_engine / "engine" / "config.json").read_text())
    assert (gpu_engine / "engine" / "rank0.engine").stat().st_size > 0
    assert cfg["pretrained_config"]["quantization"]["quant_algo"] == "FP8"
    assert cfg["build_config"]["plugin_config"]["use_paged_context_fmha"] is True
    manifest = json.loads((gpu_engine / "manifest.json").read_text())
    assert "engine/rank0.engine" in manifest["engine_files"]
    assert manifest["trtllm-engine"]["argv"][0] == "trtllm-build"
    assert check_trtllm_repository(gpu_engine / "triton_repo", check_paths=True) == []


def test_triton_serves_the_model_set_with_streaming(gpu_engine: Path) -> None:
    if not shutil.which("tritonserver") or container_folder("engine") is None:
        pytest.skip(
            "needs tritonserver and the container's model files (/app/all_models or LLMKILN_TRTLLM_MODELS)"
        )
    import tritonclient.grpc as grpcclient

    repo = gpu_engine / "triton_repo"
    assert check_trtllm_repository(repo, check_paths=True, require_model_files=True) == []
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen(
        ["tritonserver", f"--model-repository={repo}", f"--http-port={http}", f"--grpc-port={grpc}",
         f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"],
    )  # fmt: skip
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        deadline = time.time() + 300
        while time.time() < deadline and not client.is_server_ready():
            assert proc.poll() is None, "tritonserver exited"
            time.sleep(1)
        assert client.is_model_ready("ensemble")
        chunks: list[str] = []

        def on_response(result, error) -> None:
            assert error is None, error
            chunks.append(result.as_numpy("text_output")[0].decode())

        inputs = [
            grpcclient.InferInput("text_input", [1, 1], "BYTES"),
            grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
            grpcclient.InferInput("stream", [1, 1], "BOOL"),
        ]
        inputs[0].set_data_from_numpy(
            np.array([["You are a helpful assistant. Answer briefly.\nHi"]], dtype=object)
        )
        inputs[1].set_data_from_numpy(np.array([[8]], dtype=np.int32))
        inputs[2].set_data_from_numpy(np.array([[True]]))
        client.start_stream(callback=on_response)
        client.async_stream_infer("ensemble", inputs)
        client.stop_stream()
        assert len(chunks) >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)
