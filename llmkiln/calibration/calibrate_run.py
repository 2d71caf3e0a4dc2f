"""`kiln calibrate RECIPE`: run a recipe's calibration alone, without building or publishing an engine.

- backend trtllm: ModelOpt FP8 + FP8 KV (calibrate_fp8) → HF and TensorRT-LLM checkpoints, KV scales.
- backend onnx-*: KV scales for an int8/fp8 KV block store, from the recipe's engine folder when it exists
  (exactly what the build stage does), else from the fp32 HF model's cache (marked as such in the file).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from llmkiln.build.model_source import resolve_source
from llmkiln.calibration.datasets import calib_dataset, load_jsonl, texts
from llmkiln.calibration.modelopt_fp8 import calibrate_fp8, hf_kv_absmax, load_hf_model, tokenize
from llmkiln.calibration.stage import engine_kv_scales, needs_kv_scales
from llmkiln.engine_dir import EngineDir, default_engines_root
from llmkiln.errors import BadInput
from llmkiln.kv_scales import FILE_NAME as KV_SCALES_NAME
from llmkiln.kv_scales import KvScales
from llmkiln.recipe import Recipe, load_recipe


def calibrate_recipe(
    recipe_name: str,
    out_dir: Path | None = None,
    engine_dir: Path | None = None,
    engines_root: Path | None = None,
    model_override: Path | None = None,
) -> dict[str, Any]:
    """Calibrate RECIPE into out_dir (default <engines root>/.calibration/<recipe>, the root $LLMKILN_ENGINES or
    ./engines unless given); returns a summary dict."""
    engines_root = engines_root if engines_root is not None else default_engines_root()
    recipe, recipe_file = load_recipe(recipe_name)
    out = Path(out_dir) if out_dir else engines_root / ".calibration" / recipe.name
    t0 = time.perf_counter()
    data = calib_dataset(recipe)
    if recipe.is_trtllm:  # both TensorRT-LLM backends calibrate FP8 + FP8 KV with ModelOpt
        source = resolve_source(recipe, recipe_file, engines_root.absolute(), model_override).path
        res = calibrate_fp8(
            source,
            out,
            texts(load_jsonl(data), limit=recipe.calibration.samples),
            recipe.calibration.max_seq_len,
            trtllm_dtype=recipe.trtllm.dtype,
            algorithm=recipe.calibration.algorithm,
            tp_size=recipe.trtllm.tp_size,
            pp_size=recipe.trtllm.pp_size,
        )
        return {
            "recipe": recipe.name,
            "method": "modelopt-fp8",
            "out_dir": str(res.out_dir),
            "hf_checkpoint_dir": str(res.hf_checkpoint_dir),
            "trtllm_checkpoint_dir": str(res.trtllm_checkpoint_dir),
            "kv_scales": str(res.out_dir / KV_SCALES_NAME),
            "samples": res.meta["samples"],
            "seconds": round(time.perf_counter() - t0, 3),
        }
    if not needs_kv_scales(recipe):
        raise BadInput(
            f"{recipe_file}: recipe {recipe.name!r} has kv_cache.dtype {recipe.kv_cache.dtype!r} and backend "
            f"{recipe.backend!r}: there is nothing to calibrate on the CPU path (weights are quantized by the "
            "builder; KV scales are for kv_cache.dtype int8 or fp8)"
        )
    engine = Path(engine_dir) if engine_dir else engines_root / recipe.name
    if EngineDir(engine).has_onnx_model():
        scales = engine_kv_scales(engine, recipe)
        method = f"engine {engine}"
    else:
        scales = _hf_kv_scales(recipe, recipe_file, engines_root, model_override, data)
        method = "hf fp32 model (no engine folder yet)"
    path = scales.write(out / KV_SCALES_NAME)
    return {
        "recipe": recipe.name,
        "method": f"kv absmax from {method}",
        "out_dir": str(out),
        "kv_scales": str(path),
        "dtype": scales.dtype,
        "samples": scales.provenance.get("sequences"),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _hf_kv_scales(
    recipe: Recipe, recipe_file: Path, engines_root: Path, model_override: Path | None, data: Path
) -> KvScales:
    source = resolve_source(recipe, recipe_file, engines_root.absolute(), model_override).path
    seqs = tokenize(
        source,
        texts(load_jsonl(data), limit=recipe.calibration.samples),
        min(recipe.calibration.max_seq_len, recipe.limits.max_seq_len),
    )
    algorithm = "max" if recipe.calibration.algorithm == "builder" else recipe.calibration.algorithm
    stats = hf_kv_absmax(load_hf_model(source), seqs, algorithm)
    return stats.to_scales(
        recipe.kv_cache.dtype, source="hf-transformers fp32 cache (post-rotary K)", dataset=str(data)
    )
