"""Fixtures for the TensorRT-LLM room (tests/gpu).

The CPU half of a trtllm build runs here for real (ModelOpt FP8 calibration of a generated tiny Llama, the
TensorRT-LLM checkpoint, the plan, the Triton repository); GPU-only tests skip with the reason from gpu_status()
(torch.cuda.is_available() and `import tensorrt_llm`, never onnxruntime's provider list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmkiln.trtllm.engine_build import GpuStatus, gpu_status

TINY_RECIPE = "tiny-trtllm-fp8"


@pytest.fixture(scope="session")
def host() -> GpuStatus:
    return gpu_status()


@pytest.fixture(scope="session")
def gpu_host(host: GpuStatus) -> GpuStatus:
    if not host.ok:
        pytest.skip("needs a GPU host: " + "; ".join(host.missing))
    return host


@dataclass
class CpuBuild:
    """The outcome of `kiln build tiny-trtllm-fp8` on a host without GPU: the pending folder and the exit-3 error."""

    engines_root: Path
    pending: Path
    error: str

    @property
    def plan_path(self) -> Path:
        return self.pending / "plan.json"

    def hf_config(self) -> dict:
        return json.loads((self.pending / "calibration" / "hf_config.json").read_text())


@pytest.fixture(scope="session")
def cpu_build(tmp_path_factory: pytest.TempPathFactory, host: GpuStatus) -> CpuBuild:
    """Build tiny-trtllm-fp8 once; on this CPU host it must stop with NeedsGpuHost after the CPU stages."""
    from llmkiln.backends import build as build_engine
    from llmkiln.build.progress import QuietProgress
    from llmkiln.errors import NeedsGpuHost
    from llmkiln.trtllm.stages import pending_dir

    if host.ok:
        pytest.skip("GPU host: the build does not stop at the plan here (see test_gpu_engine.py)")
    root = tmp_path_factory.mktemp("trtllm-engines")
    with pytest.raises(NeedsGpuHost) as exc:
        build_engine(TINY_RECIPE, root, progress=QuietProgress())
    return CpuBuild(root, pending_dir(root, TINY_RECIPE), str(exc.value))
