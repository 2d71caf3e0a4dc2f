"""Which stages build each backend — the one place that knows the stages of every room — and `build`, the
whole build as `kiln build` runs it.

The pipeline (llmkiln.build.pipeline) runs whatever stages it is given; this module sits above the rooms whose
stages it lists (build, calibration, trtllm), so that imports keep flowing one way. Entries are stage classes
(a fresh instance per build) or instances (tests add their own).
"""

from __future__ import annotations

import os
from pathlib import Path

from llmkiln.build.onnx_export import OnnxExportStage, TokenizerStage
from llmkiln.build.onnx_gpu import OnnxTrtEngineStage
from llmkiln.build.openvino_export import OpenVinoExportStage
from llmkiln.build.pipeline import BuildResult, build_engine
from llmkiln.build.progress import BuildProgress
from llmkiln.build.stages import Stage
from llmkiln.build.warmup_check import WarmupCheckStage
from llmkiln.calibration.stage import CpuCalibrationStage, FakeQuantQualityStage
from llmkiln.capabilities import Backend
from llmkiln.engine_dir import default_engines_root
from llmkiln.errors import BuildFailed
from llmkiln.trtllm.llmapi_stages import LlmapiCheckpointStage, LlmapiOptionsStage, LlmapiRepoStage
from llmkiln.trtllm.stages import (
    TrtllmCheckpointStage,
    TrtllmEngineStage,
    TrtllmRepoStage,
    TrtllmTokenizerStage,
)

# backend -> its stages, in order
STAGES: dict[Backend, list[type | Stage]] = {
    Backend.ONNX_CPU: [OnnxExportStage, TokenizerStage, WarmupCheckStage, CpuCalibrationStage],
    Backend.ONNX_GPU: [OnnxExportStage, TokenizerStage, WarmupCheckStage, OnnxTrtEngineStage],
    # the IR is fp32 as stored; bf16 is chosen at load, and gated here by the quality diff like int8
    Backend.OPENVINO_CPU: [OpenVinoExportStage, TokenizerStage, WarmupCheckStage, CpuCalibrationStage],
    Backend.TRTLLM: [
        TrtllmCheckpointStage,
        FakeQuantQualityStage,
        TrtllmTokenizerStage,
        TrtllmRepoStage,
        TrtllmEngineStage,
    ],
    # everything on a CPU host: the PyTorch backend loads the HF checkpoint, no engine build
    Backend.TRTLLM_LLMAPI: [
        LlmapiCheckpointStage,
        FakeQuantQualityStage,
        LlmapiOptionsStage,
        LlmapiRepoStage,
    ],
}


def stages_for(backend: Backend) -> list[Stage]:
    """The backend's stages, in order, instantiated (BuildFailed when it has none)."""
    entries = STAGES.get(backend) or []
    if not entries:
        raise BuildFailed(f"backend {backend!r}: no build stages are available for it in this installation")
    return [entry() if isinstance(entry, type) else entry for entry in entries]


def build(
    recipe: str | os.PathLike[str],
    engines_root: Path | None = None,
    *,
    force: bool = False,
    model_override: Path | None = None,
    progress: BuildProgress | None = None,
    dry_run: bool = False,
    allow_quality_regression: bool = False,
) -> BuildResult:
    """Build (or find up to date) the engine for a recipe under `engines_root` (default: $LLMKILN_ENGINES or
    ./engines). See llmkiln.build.pipeline for what a build does."""
    return build_engine(
        recipe,
        engines_root if engines_root is not None else default_engines_root(),
        stages_for=stages_for,
        force=force,
        model_override=model_override,
        progress=progress,
        dry_run=dry_run,
        allow_quality_regression=allow_quality_regression,
    )
