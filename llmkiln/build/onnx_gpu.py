"""The ONNX engine on a GPU through onnxruntime-gpu: CUDA EP, or TensorRT EP with an ahead-of-time engine.

TensorRT EP options (../shared/reference/trtllm-triton.md §5.2): engine cache + timing cache under
<engine>/trt_cache/, optional CUDA graphs, and an explicit optimization profile from the recipe's limits so the
engine is built once, ahead of time, and never rebuilt for a longer prompt (ORT compares the profile with the
cached `.profile` file and rebuilds on mismatch, so serving passes the same options again). The EP-context model
(trt_dump_ep_context_model) is written next to model.onnx: an ONNX wrapper around the compiled engine(s) that
starts without parsing or building. Nodes TensorRT cannot take (GroupQueryAttention, a com.microsoft contrib op)
run on the CUDA EP, listed second as the fallback.

Gating: torch.cuda.is_available() and the onnxruntime-gpu distribution installed (plus `import tensorrt` for the
TensorRT EP). onnxruntime's *available* provider list is never consulted: onnxruntime-gpu lists CUDA/TensorRT
providers on a machine without a GPU too. What a created session *registered* (session.get_providers()) is: an EP
whose library fails to load is dropped without an error, so the build and the runner (runtime/runner.py,
check_session_providers) refuse with exit 3 when a provider they asked for is not there. onnxruntime and
onnxruntime-gpu never share an environment (extras `cpu` / `gpu`).
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from llmkiln.build.stages import BuildContext
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput, NeedsGpuHost
from llmkiln.recipe import Recipe

Provider = Literal["cuda", "tensorrt"]
TRT_CACHE_DIR = "trt_cache"
EP_CONTEXT_MODEL = "model_ctx.onnx"


@dataclass(frozen=True)
class OnnxGpuStatus:
    """What this host has for onnxruntime-gpu; `missing` says what is not there."""

    cuda: bool
    onnxruntime_gpu: bool
    tensorrt: bool
    missing: tuple[str, ...]

    def ok(self, provider: Provider) -> bool:
        return self.cuda and self.onnxruntime_gpu and (provider == "cuda" or self.tensorrt)


def onnx_gpu_status() -> OnnxGpuStatus:
    missing: list[str] = []
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
        if not cuda:
            missing.append(f"CUDA (torch {torch.__version__}: torch.cuda.is_available() is False)")
    except Exception as exc:  # broken torch = no CUDA, with the reason
        cuda = False
        missing.append(f"CUDA (import torch failed: {exc})")
    try:
        metadata.version("onnxruntime-gpu")
        ort_gpu = True
    except metadata.PackageNotFoundError:
        ort_gpu = False
        missing.append(
            "onnxruntime-gpu (not installed: pip install -e '.[gpu]' in an environment without onnxruntime)"
        )
    try:
        importlib.import_module("tensorrt")
        trt = True
    except Exception as exc:  # ImportError or a library load error
        trt = False
        missing.append(
            f"TensorRT (import tensorrt failed: {type(exc).__name__}) — needed for the TensorRT EP only"
        )
    return OnnxGpuStatus(cuda, ort_gpu, trt, tuple(missing))


def dim_ranges(recipe: Recipe, head_size: int) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) for each symbolic dimension of the builder's graph. opt targets a prefill (TTFT)."""
    b, s, i = recipe.scheduler.max_batch_size, recipe.limits.max_seq_len, recipe.limits.max_input_len
    p = min(recipe.scheduler.max_prefill_tokens, i)
    return {
        "batch_size": (1, 1, b),
        "sequence_length": (1, p, i),
        "total_sequence_length": (1, p, s),
        "past_sequence_length": (0, s, s),  # empty past (first prefill) up to a max-length shared KV buffer
        "kv_cache_dim": (head_size, head_size, head_size),
    }


def profile_shapes(model_path: Path, recipe: Recipe) -> dict[str, str]:
    """{"trt_profile_min_shapes": "input_ids:1x1,...", opt, max} covering every dynamic graph input."""
    import onnx

    genai = json.loads((model_path.parent / "genai_config.json").read_text())
    head_size = int(genai["model"]["decoder"]["head_size"])
    ranges = dim_ranges(recipe, head_size)
    graph = onnx.load(str(model_path), load_external_data=False).graph
    shapes: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for inp in graph.input:
        dims = inp.type.tensor_type.shape.dim
        if all(d.dim_param == "" for d in dims):
            continue  # static input: no profile entry
        for k, idx in (("min", 0), ("opt", 1), ("max", 2)):
            vals = []
            for d in dims:
                if d.dim_param:
                    if d.dim_param not in ranges:
                        raise BadInput(
                            f"{model_path}: input {inp.name} has an unknown symbolic dim {d.dim_param!r}"
                        )
                    vals.append(str(ranges[d.dim_param][idx]))
                else:
                    vals.append(str(d.dim_value))
            shapes[k].append(f"{inp.name}:{'x'.join(vals)}")
    return {f"trt_profile_{k}_shapes": ",".join(v) for k, v in shapes.items()}


def provider_options(
    recipe: Recipe,
    engine_dir: Path,
    provider: Provider = "tensorrt",
    *,
    cuda_graph: bool = False,
    fp16: bool = False,
    device_id: int = 0,
) -> list[tuple[str, dict[str, Any]]]:
    """The `providers=` list for onnxruntime.InferenceSession (TensorRT EP first, CUDA EP as fallback)."""
    cuda = ("CUDAExecutionProvider", {"device_id": device_id})
    if provider == "cuda":
        return [cuda]
    cache = engine_dir / TRT_CACHE_DIR
    trt = {
        "device_id": device_id,
        "trt_fp16_enable": fp16,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache),
        "trt_cuda_graph_enable": cuda_graph,
        "trt_builder_optimization_level": 3,
        "trt_dump_ep_context_model": True,
        "trt_ep_context_file_path": str(engine_dir / EP_CONTEXT_MODEL),
        "trt_ep_context_embed_mode": 0,
        **profile_shapes(engine_dir / "model.onnx", recipe),
    }
    return [("TensorrtExecutionProvider", trt), cuda]


def build_trt_engine(recipe: Recipe, engine_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """Create a TensorRT-EP session once: builds the engine(s) ahead of time into trt_cache/ (GPU host only)."""
    status = onnx_gpu_status()
    if not status.ok("tensorrt"):
        raise BadInput("TensorRT EP build needs: " + "; ".join(status.missing))
    import onnxruntime as ort

    providers = provider_options(recipe, engine_dir, "tensorrt", **kwargs)
    (engine_dir / TRT_CACHE_DIR).mkdir(exist_ok=True)
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(engine_dir / "model.onnx"), providers=providers)
    seconds = time.perf_counter() - t0
    registered = list(sess.get_providers())
    if registered[:1] != ["TensorrtExecutionProvider"]:
        # onnxruntime retried without the TensorRT EP (its library did not load): nothing was built
        raise NeedsGpuHost(
            f"{engine_dir}: the TensorRT EP did not load (onnxruntime registered {', '.join(registered)}), so no "
            "engine was built; onnxruntime's error above names the library it could not open (TensorRT's "
            "libnvinfer, or the CUDA EP's libraries)"
        )
    return {
        "providers": sess.get_providers(),
        "build_seconds": round(seconds, 3),
        "cache_files": sorted(p.name for p in (engine_dir / TRT_CACHE_DIR).iterdir()),
        "options": {k: v for k, v in providers[0][1].items() if not k.startswith("trt_profile")},
    }


class OnnxTrtEngineStage:
    """onnx-gpu backend: the ahead-of-time TensorRT EP engine on a GPU host; recorded as skipped elsewhere."""

    name = "onnx-trt-engine"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {"recipe": ctx.recipe.compute_hash()}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        # The runner serves the engine with these providers (execution_providers.json): TensorRT EP on the cache
        # built here, CUDA EP as fallback; on a host without them loading the engine is exit 3, never a silent CPU run.
        EngineDir(out_dir).write_execution_providers(provider_options(ctx.recipe, out_dir, "tensorrt"))
        status = onnx_gpu_status()
        if not status.ok("tensorrt"):
            ctx.progress.info("onnx-trt-engine: skipped, " + "; ".join(status.missing))
            return {
                "skipped": list(status.missing),
                "profile": profile_shapes(out_dir / "model.onnx", ctx.recipe),
            }
        return build_trt_engine(ctx.recipe, out_dir)
