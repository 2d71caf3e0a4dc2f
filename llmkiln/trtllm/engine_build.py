"""GPU gating, running the recorded trtllm-build argv, and checking the engine folder it writes.

Gating (the only test of "is this a GPU host"): `import tensorrt_llm` works AND torch.cuda.is_available().
onnxruntime's provider list is never consulted: it lists CUDA/TensorRT providers whenever onnxruntime-gpu is
installed, GPU or not.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmkiln.errors import BuildFailed
from llmkiln.recipe import Recipe
from llmkiln.trtllm.plan import ENGINE_DIR, validate_argv


@dataclass(frozen=True)
class GpuStatus:
    """What this host has for the TensorRT-LLM stages; `missing` names what is not there and why."""

    cuda: bool
    tensorrt_llm: bool
    missing: tuple[str, ...]
    tensorrt_llm_version: str | None = None
    device: str | None = None

    @property
    def ok(self) -> bool:
        return self.cuda and self.tensorrt_llm


def gpu_status() -> GpuStatus:
    """Probe CUDA (torch) and TensorRT-LLM (import). Never raises."""
    missing: list[str] = []
    cuda, device = False, None
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
        if cuda:
            device = torch.cuda.get_device_name(0)
        else:
            missing.append(f"CUDA (torch {torch.__version__}: torch.cuda.is_available() is False)")
    except Exception as exc:  # a broken torch install is "no CUDA", with the reason
        missing.append(f"CUDA (import torch failed: {exc})")
    trt, version = False, None
    try:
        mod = importlib.import_module("tensorrt_llm")
        trt, version = True, str(getattr(mod, "__version__", "unknown"))
    except Exception as exc:  # ImportError, or a CUDA/TensorRT library error raised at import
        missing.append(f"TensorRT-LLM (import tensorrt_llm failed: {type(exc).__name__}: {exc})")
    return GpuStatus(cuda, trt, tuple(missing), version, device)


def run_trtllm_build(argv: list[str], cwd: Path, log_path: Path) -> float:
    """Run the recorded argv in `cwd` (the plan folder); returns seconds. BuildFailed with the log's tail."""
    import time

    validate_argv(argv)
    exe = shutil.which(argv[0])
    if exe is None:
        raise BuildFailed(
            f"{argv[0]} is not on PATH (it comes with the tensorrt_llm wheel); PATH is the container's"
        )
    out_dir = cwd / ENGINE_DIR
    if out_dir.exists():
        shutil.rmtree(out_dir)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(
            [exe, *argv[1:]], cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    seconds = time.perf_counter() - t0
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-25:]
        raise BuildFailed(
            f"trtllm-build exited with {rc} after {seconds:.0f} s; last lines of {log_path}:\n"
            + "\n".join(tail)
        )
    return seconds


def validate_engine(engine_dir: Path, recipe: Recipe) -> dict[str, Any]:
    """engine/config.json + rank*.engine, and the build settings the recipe asked for. Returns a summary."""
    cfg_path = engine_dir / "config.json"
    if not cfg_path.is_file():
        raise BuildFailed(
            f"{engine_dir}: no config.json (the tensorrtllm backend reads it from gpt_model_path)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise BuildFailed(f"{cfg_path}: not JSON ({exc})") from exc
    build = cfg.get("build_config") or {}
    pretrained = cfg.get("pretrained_config") or {}
    world = recipe.trtllm.tp_size * recipe.trtllm.pp_size
    ranks = [f"rank{r}.engine" for r in range(world)]
    missing = [r for r in ranks if not (engine_dir / r).is_file()]
    if missing:
        raise BuildFailed(f"{engine_dir}: missing {missing} for world size {world}")
    want = {
        "max_batch_size": recipe.scheduler.max_batch_size,
        "max_seq_len": recipe.limits.max_seq_len,
        "max_num_tokens": recipe.scheduler.max_num_tokens,
    }
    wrong = {k: (build.get(k), v) for k, v in want.items() if k in build and build.get(k) != v}
    if wrong:
        raise BuildFailed(f"{cfg_path}: build_config differs from the recipe (got, want): {wrong}")
    quant = (pretrained.get("quantization") or {}).get("quant_algo")
    if quant not in (None, "FP8"):
        raise BuildFailed(f"{cfg_path}: pretrained_config.quantization.quant_algo is {quant!r}, want FP8")
    plugin = build.get("plugin_config") or {}
    return {
        "version": cfg.get("version"),
        "rank_files": ranks,
        "engine_bytes": sum((engine_dir / r).stat().st_size for r in ranks),
        "build_config": {
            k: build.get(k) for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")
        },
        "plugin_config": {
            k: plugin.get(k)
            for k in (
                "gpt_attention_plugin",
                "gemm_plugin",
                "use_paged_context_fmha",
                "use_fp8_context_fmha",
                "tokens_per_block",
                "multiple_profiles",
            )
        },  # fmt: skip
    }
