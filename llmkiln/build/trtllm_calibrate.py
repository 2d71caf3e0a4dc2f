"""FP8 weights + FP8 KV calibration for the TensorRT-LLM path: the calibration room's `calibrate_fp8` when present.

`llmkiln.calibration.modelopt_fp8.calibrate_fp8(hf_dir, out_dir, texts, max_seq_len)` (the calibration room) is the
implementation: ModelOpt fake quantization on CPU, both exports, calibrated KV scales kept. Until it is installed,
`_fallback_calibrate` does the minimum this room needs with ModelOpt directly (mtq.quantize with FP8_DEFAULT_CFG +
the FP8 KV quantizer entries, config.architectures set, export_tensorrt_llm_checkpoint); it writes no HF export
and reports the exported (clamped) KV scales.
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.errors import BadInput, BuildFailed
from llmkiln.recipe import Recipe

DEFAULT_TEXTS = {"stories": "calibration/stories-calib.jsonl", "chat": "calibration/chat-calib.jsonl"}


@dataclass
class Fp8Calibration:
    """Where calibration put its outputs (a subset of the calibration room's result)."""

    trtllm_checkpoint_dir: Path
    hf_checkpoint_dir: Path | None = None
    kv_scales: Any = None
    implementation: str = "fallback"
    extra: dict[str, Any] = field(default_factory=dict)


def calibration_texts(recipe: Recipe) -> list[str]:
    """The recipe's calibration texts (calibration.dataset, or the project's chat set), at most `samples`."""
    from llmkiln.calibration.datasets import load_jsonl, resolve_dataset, texts

    path = resolve_dataset(recipe.calibration.dataset or DEFAULT_TEXTS["chat"])
    return texts(load_jsonl(path), limit=recipe.calibration.samples)


def calibrate(recipe: Recipe, hf_dir: Path, out_dir: Path) -> Fp8Calibration:
    """Run FP8 + FP8-KV calibration of hf_dir into out_dir/calibration (the TRT-LLM checkpoint is found in the
    result; the stage moves it to out_dir/checkpoint)."""
    texts = calibration_texts(recipe)
    try:
        mod = importlib.import_module("llmkiln.calibration.modelopt_fp8")
    except ModuleNotFoundError as exc:
        if exc.name != "llmkiln.calibration.modelopt_fp8":
            raise
        mod = None
    if mod is not None:
        if recipe.trtllm.tp_size * recipe.trtllm.pp_size != 1:
            raise BadInput(
                "field 'trtllm.tp_size'/'trtllm.pp_size': the calibration stage exports a single-rank checkpoint; "
                "multi-GPU recipes are not supported yet"
            )
        res = mod.calibrate_fp8(
            hf_dir,
            out_dir / "calibration",
            texts,
            recipe.calibration.max_seq_len,
            trtllm_dtype=recipe.trtllm.dtype,
        )
        return Fp8Calibration(
            trtllm_checkpoint_dir=Path(res.trtllm_checkpoint_dir),
            hf_checkpoint_dir=Path(res.hf_checkpoint_dir)
            if getattr(res, "hf_checkpoint_dir", None)
            else None,
            kv_scales=getattr(res, "kv_scales", None),
            implementation="llmkiln.calibration.modelopt_fp8",
        )
    return _fallback_calibrate(hf_dir, out_dir, texts, recipe)


def _fallback_calibrate(hf_dir: Path, out_dir: Path, texts: list[str], recipe: Recipe) -> Fp8Calibration:
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    max_seq_len, dtype = recipe.calibration.max_seq_len, recipe.trtllm.dtype
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(mtq.FP8_KV_CFG["quant_cfg"])

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for text in texts:
                ids = tok(text, return_tensors="pt", truncation=True, max_length=max_seq_len).input_ids
                m(ids)

    model = mtq.quantize(model, cfg, forward_loop)
    if not getattr(model.config, "architectures", None):
        model.config.architectures = ["LlamaForCausalLM"]
    ckpt = out_dir / "checkpoint"
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    try:
        export_tensorrt_llm_checkpoint(
            model,
            "llama",
            torch_dtype,
            str(ckpt),
            inference_tensor_parallel=recipe.trtllm.tp_size,
            inference_pipeline_parallel=recipe.trtllm.pp_size,
        )
    except Exception as exc:  # ModelOpt raises assorted types; report them as a build failure
        raise BuildFailed(f"ModelOpt export_tensorrt_llm_checkpoint failed for {hf_dir}: {exc}") from exc
    calib = out_dir / "calibration"
    calib.mkdir(parents=True, exist_ok=True)
    (calib / "modelopt_fp8.json").write_text(
        json.dumps(
            {"implementation": "fallback", "samples": len(texts), "max_seq_len": max_seq_len}, indent=2
        )
    )
    return Fp8Calibration(trtllm_checkpoint_dir=ckpt, implementation="fallback (ModelOpt direct)")
