"""FP8 weights + FP8 KV calibration for the TensorRT-LLM path: the glue between the recipe and the calibration room.

`llmkiln.calibration.modelopt_fp8.calibrate_fp8` does the work (ModelOpt fake quantization on CPU, both exports,
calibrated KV scales kept); this module picks the recipe's calibration texts and checks what it supports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.calibration.datasets import load_jsonl, resolve_dataset, texts
from llmkiln.calibration.modelopt_fp8 import calibrate_fp8
from llmkiln.errors import BadInput
from llmkiln.kv_scales import KvScales
from llmkiln.recipe import Recipe

DEFAULT_TEXTS = "calibration/chat-calib.jsonl"


@dataclass
class Fp8Calibration:
    """Where calibration put its outputs."""

    trtllm_checkpoint_dir: Path
    hf_checkpoint_dir: Path | None
    kv_scales: KvScales
    implementation: str = "llmkiln.calibration.modelopt_fp8"
    extra: dict[str, Any] = field(default_factory=dict)


def calibration_texts(recipe: Recipe, recipe_file: Path | None = None) -> list[str]:
    """The recipe's calibration texts (calibration.dataset, or the bundled chat set), at most `samples`."""
    base = recipe_file.parent if recipe_file is not None else None
    path = resolve_dataset(recipe.calibration.dataset or DEFAULT_TEXTS, base)
    return texts(load_jsonl(path), limit=recipe.calibration.samples)


def calibrate(recipe: Recipe, hf_dir: Path, out_dir: Path, recipe_file: Path | None = None) -> Fp8Calibration:
    """Run FP8 + FP8-KV calibration of hf_dir into out_dir/calibration (the TRT-LLM checkpoint is found in the
    result; the stage moves it to out_dir/checkpoint)."""
    if recipe.trtllm.tp_size * recipe.trtllm.pp_size != 1:
        raise BadInput(
            "field 'trtllm.tp_size'/'trtllm.pp_size': the calibration stage exports a single-rank checkpoint; "
            "multi-GPU recipes are not supported yet"
        )
    res = calibrate_fp8(
        hf_dir,
        out_dir / "calibration",
        calibration_texts(recipe, recipe_file),
        recipe.calibration.max_seq_len,
        trtllm_dtype=recipe.trtllm.dtype,
    )
    return Fp8Calibration(
        trtllm_checkpoint_dir=Path(res.trtllm_checkpoint_dir),
        hf_checkpoint_dir=Path(res.hf_checkpoint_dir),
        kv_scales=res.kv_scales,
    )
