"""Build an LLMEngine from an engine folder: recipe.resolved.yaml (+ overrides), genai_config.json, tokenizer.json,
calibration/kv_scales.json when present."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe, _merge, validate
from llmkiln.runtime.kv_quant import KV_SCALES_FILE, KvScales, is_quantized
from llmkiln.runtime.model_info import ModelInfo
from llmkiln.runtime.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from llmkiln.runtime.engine import LLMEngine


def load_resolved_recipe(engine_dir: Path, overrides: dict[str, Any] | None = None) -> Recipe:
    path = engine_dir / "recipe.resolved.yaml"
    if not path.is_file():
        raise BadInput(f"{path}: missing; is {engine_dir} an engine folder built by `kiln build`?")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping")
    if overrides:
        if not isinstance(overrides, dict):
            raise BadInput(
                f"overrides must be a nested mapping like {{'scheduler': {{...}}}}, got {overrides!r}"
            )
        data = _merge(data, overrides)
    return validate(data, f"{path} (with overrides)" if overrides else str(path))


def load_engine(cls: type[LLMEngine], engine_dir: Path, overrides: dict[str, Any] | None = None) -> LLMEngine:
    from tokenizers import Tokenizer

    from llmkiln.runtime.runner import OnnxRunner  # imports onnxruntime

    if not engine_dir.is_dir():
        raise BadInput(f"engine folder {engine_dir} does not exist; build it with `kiln build RECIPE`")
    recipe = load_resolved_recipe(engine_dir, overrides)
    info = ModelInfo.from_engine_dir(engine_dir)
    if recipe.limits.max_seq_len > info.context_length:
        raise BadInput(
            f"{engine_dir}/recipe.resolved.yaml: limits.max_seq_len {recipe.limits.max_seq_len} exceeds the "
            f"model's context length {info.context_length}"
        )
    kv = recipe.kv_cache
    scales = None
    scales_path = engine_dir / KV_SCALES_FILE
    if is_quantized(kv.dtype) and scales_path.is_file():
        scales = KvScales.load(scales_path, info.num_layers, info.kv_heads)
    tok_path = engine_dir / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tok_path)) if tok_path.is_file() else None
    config = SchedulerConfig.from_recipe(recipe, info.eos_token_ids)
    runner = OnnxRunner(
        engine_dir,
        info,
        num_slots=config.max_batch_size,
        max_len=recipe.limits.max_seq_len,
        tokens_per_block=kv.tokens_per_block,
        store_max_bytes=kv.max_bytes if kv.prefix_reuse else 0,
        kv_dtype=kv.dtype,
        kv_scales=scales,
        intra_op_threads=recipe.scheduler.intra_op_threads,
    )
    engine = cls(config, runner, tokenizer, recipe)
    engine.engine_dir = engine_dir
    engine.model_info = info
    return engine
