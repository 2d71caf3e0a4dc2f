"""Open an engine folder as a ready-to-start LLMEngine: its resolved recipe (+ overrides), genai_config.json,
tokenizer.json and, for an int8/fp8 KV block store, calibration/kv_scales.json — all read through
llmkiln.engine_dir. The runner follows the recipe's backend: onnxruntime (onnx-cpu, onnx-gpu) or OpenVINO's
PagedAttention graph (openvino-cpu, llmkiln.runtime.openvino_runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from llmkiln.capabilities import Backend
from llmkiln.engine_dir import EngineDir, resolve_engine
from llmkiln.errors import BadInput
from llmkiln.kv_scales import is_quantized
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.plan import Runner
from llmkiln.runtime.runner import OnnxRunner
from llmkiln.runtime.scheduler import SchedulerConfig


def load_engine(engine: str | Path | EngineDir, overrides: dict[str, Any] | None = None) -> LLMEngine:
    """An LLMEngine for an engine folder (or a recipe name under the engines root); not started yet.

    `overrides` are nested recipe fields, e.g. {"scheduler": {"max_batch_size": 4}}, validated like the recipe.
    """
    folder = engine if isinstance(engine, EngineDir) else resolve_engine(engine)
    recipe = folder.runtime_recipe(overrides)
    info = folder.genai_config()
    if recipe.limits.max_seq_len > info.context_length:
        raise BadInput(
            f"{folder.path}/recipe.resolved.yaml: limits.max_seq_len {recipe.limits.max_seq_len} exceeds the "
            f"model's context length {info.context_length}"
        )
    kv = recipe.kv_cache
    scales = folder.kv_scales(info.num_layers, info.kv_heads) if is_quantized(kv.dtype) else None
    tok_file = folder.tokenizer_file()
    tokenizer = Tokenizer.from_file(str(tok_file)) if tok_file is not None else None
    config = SchedulerConfig.from_recipe(recipe, folder.stop_token_ids())
    runner: Runner
    if recipe.backend is Backend.OPENVINO_CPU:
        from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner  # imports openvino

        xml = folder.openvino_model()
        if xml is None:
            raise BadInput(f"{folder.path}: no openvino_model.xml/.bin; rebuild it with `kiln build`")
        runner = OpenVinoPagedRunner(
            xml,
            num_slots=recipe.scheduler.max_batch_size,
            max_len=recipe.limits.max_seq_len,
            tokens_per_block=kv.tokens_per_block,
            store_max_bytes=kv.max_bytes if kv.prefix_reuse else 0,
            precision=recipe.precision,
            threads=recipe.scheduler.intra_op_threads,
            cascade=kv.cascade,
            prompt_graph=recipe.scheduler.prompt_graph,
        )
    else:
        providers = folder.execution_providers()
        runner = OnnxRunner(
            folder.path,
            info,
            num_slots=recipe.scheduler.max_batch_size,
            max_len=recipe.limits.max_seq_len,
            tokens_per_block=kv.tokens_per_block,
            store_max_bytes=kv.max_bytes if kv.prefix_reuse else 0,
            kv_dtype=kv.dtype,
            kv_scales=scales,
            intra_op_threads=recipe.scheduler.intra_op_threads,
            intra_op_spinning=recipe.scheduler.intra_op_spinning,
            # onnx-gpu: the build's TensorRT EP / CUDA EP list; the built TensorRT engine is for the graph as
            # exported, so the last-logits rewrite (a different graph, a rebuild at load) is skipped
            last_logits_only=providers is None,
            providers=providers,
        )
    return LLMEngine(config, runner, tokenizer, recipe, engine_dir=folder.path)
