"""The Triton repository of the tensorrtllm model set for a TensorRT-LLM engine, built as protobuf messages.

Five models, as in tensorrtllm_backend's all_models/inflight_batcher_llm (../shared/reference/trtllm-triton.md §2):
ensemble (preprocessing → tensorrt_llm → postprocessing), preprocessing and postprocessing (python, HF tokenizer),
tensorrt_llm (the C++ `tensorrtllm` backend running the engine) and tensorrt_llm_bls (python BLS alternative to the
ensemble). Each config.pbtxt is a tritonclient `model_config_pb2.ModelConfig` written with text_format: every
template parameter is either filled with a concrete value or deliberately left out (OMITTED_PARAMETERS, with the
reason), so no `${...}` can remain. tensorrt_llm and tensorrt_llm_bls are decoupled (streaming). tensorrt_llm
carries `model_warmup` built from the recipe's warmup prefixes and prompts, tokenized exactly as the
preprocessing model does (HF AutoTokenizer, add_special_tokens), so the warmup requests fill TensorRT-LLM's KV
block cache with the shared prefixes before the server reports READY.

The python models' model.py files are not vendored: they come from the pinned container
(/app/all_models/inflight_batcher_llm, or $LLMKILN_TRTLLM_MODELS), whose config.pbtxt I/O names and parameter
keys are compared with these first (llmkiln.trtllm.upstream). `upstream_models` copies them in; otherwise each
model folder gets an UPSTREAM.md naming the files, and `check_trtllm_repository(..., require_model_files=True)`
refuses to call the repository servable.
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.atomic import atomic_dir
from llmkiln.build.warmup_check import check_warmup
from llmkiln.capabilities import Backend
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.trtllm import model_io as io
from llmkiln.trtllm import pins

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls")
PYTHON_MODELS = {
    "preprocessing": ("model.py",),
    "postprocessing": ("model.py",),
    "tensorrt_llm_bls": ("model.py", "lib/decode.py", "lib/triton_decoder.py"),
}
UPSTREAM_DIR = "triton_backend/all_models/inflight_batcher_llm"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
WARMUP_DIR = "warmup"
# scheduler.batching -> the tensorrtllm backend's gpt_model_type
GPT_MODEL_TYPES = {"inflight": "inflight_fused_batching", "static": "V1"}


@dataclass
class TrtllmRepoSpec:
    """Everything the five configs need. Paths are where the files will be on the serving host."""

    recipe: Recipe
    engine_dir: Path  # folder with config.json + rank*.engine (gpt_model_path)
    tokenizer_dir: Path  # HF tokenizer folder (pre/postprocessing)
    warmup_ids: list[list[int]] = field(default_factory=list)
    end_id: int = 2
    pad_id: int = 2


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _io(msg_cls: Any, rows: list[io.IO]) -> list[Any]:
    out = []
    for name, dtype, dims, flags in rows:
        m = msg_cls(name=name, data_type=dtype, dims=list(dims))
        if msg_cls is mc.ModelInput:
            m.optional = "o" in flags
            m.allow_ragged_batch = "g" in flags
            if "r" in flags:
                m.reshape.SetInParent()  # reshape: { shape: [ ] }
        out.append(m)
    return out


def _params(cfg: mc.ModelConfig, values: dict[str, str]) -> None:
    for key, value in values.items():
        cfg.parameters[key].string_value = value


def _queue(cfg: mc.ModelConfig, recipe: Recipe) -> None:
    db = cfg.dynamic_batching
    db.preferred_batch_size.append(recipe.scheduler.max_batch_size)
    db.max_queue_delay_microseconds = recipe.trtllm.max_queue_delay_microseconds
    db.default_queue_policy.max_queue_size = recipe.scheduler.max_queue_size


def _instances(cfg: mc.ModelConfig, count: int) -> None:
    cfg.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)


def tensorrt_llm_parameters(spec: TrtllmRepoSpec) -> dict[str, str]:
    """Every tensorrt_llm parameter this repository fills (the rest: model_io.OMITTED_PARAMETERS)."""
    r, t = spec.recipe, spec.recipe.trtllm
    values = {
        "max_beam_width": str(t.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": GPT_MODEL_TYPES[r.scheduler.batching],
        "gpt_model_path": str(spec.engine_dir),
        "max_attention_window_size": str(r.limits.max_seq_len),
        "sink_token_length": "0",
        "batch_scheduler_policy": t.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": repr(float(r.kv_cache.free_gpu_memory_fraction)),
        "kv_cache_host_memory_bytes": str(t.kv_cache_host_memory_bytes),
        "kv_cache_onboard_blocks": "true",
        "exclude_input_in_output": _b(t.exclude_input_in_output),
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": "1000",
        "request_stats_max_iterations": "0",
        "enable_kv_cache_reuse": _b(r.kv_cache.prefix_reuse),
        "normalize_log_probs": "true",
        "enable_chunked_context": _b(r.scheduler.chunked_prefill),
        "lora_cache_optimal_adapter_size": "8",
        "lora_cache_max_adapter_size": "64",
        "lora_cache_gpu_memory_fraction": "0.05",
        "lora_cache_host_memory_bytes": str(2**30),
        "decoding_mode": "top_k_top_p" if t.max_beam_width == 1 else "beam_search",
        "executor_worker_path": EXECUTOR_WORKER,
        "gpu_weights_percent": "1.0",
        "enable_context_fmha_fp32_acc": _b(t.enable_context_fmha_fp32_acc),
        "multi_block_mode": _b(t.multi_block_mode),
        "cuda_graph_mode": _b(t.cuda_graph_mode),
        "cuda_graph_cache_size": str(t.cuda_graph_cache_size),
        "speculative_decoding_fast_logits": "false",
        # Read without a fallback by the C++ backend (getGuidedDecodingConfigFromParams): must be present.
        # Empty guided_decoding_backend / xgrammar_tokenizer_info_path = guided decoding off.
        "tokenizer_dir": str(spec.tokenizer_dir),
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    if t.max_tokens_in_paged_kv_cache is not None:
        values["max_tokens_in_paged_kv_cache"] = str(t.max_tokens_in_paged_kv_cache)
    return values


def tensorrt_llm_config(spec: TrtllmRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(
        name="tensorrt_llm", backend="tensorrtllm", max_batch_size=r.scheduler.max_batch_size
    )
    cfg.model_transaction_policy.decoupled = True
    _queue(cfg, r)
    cfg.input.extend(_io(mc.ModelInput, io.TENSORRT_LLM_INPUTS))
    cfg.output.extend(_io(mc.ModelOutput, io.TENSORRT_LLM_OUTPUTS))
    _instances(cfg, 1)
    _params(cfg, tensorrt_llm_parameters(spec))
    for i, ids in enumerate(spec.warmup_ids):
        w = cfg.model_warmup.add(name=f"prefix_{i}", batch_size=1, count=max(r.warmup.count, 1))
        for name, dims in (
            ("input_ids", [len(ids)]),
            ("input_lengths", [1]),
            ("request_output_len", [1]),
            ("end_id", [1]),
            ("pad_id", [1]),
        ):
            w.inputs[name].data_type = mc.TYPE_INT32
            w.inputs[name].dims.extend(dims)
            w.inputs[name].input_data_file = warmup_file_name(i, name)
    return cfg


def warmup_file_name(i: int, name: str) -> str:
    return f"prefix_{i}_{name}"


def warmup_files(spec: TrtllmRepoSpec) -> dict[str, bytes]:
    """Raw little-endian INT32 tensors (Triton reads input_data_file row-major from <model>/warmup/)."""
    out: dict[str, bytes] = {}
    for i, ids in enumerate(spec.warmup_ids):
        values = {
            "input_ids": ids,
            "input_lengths": [len(ids)],
            "request_output_len": [spec.recipe.warmup.max_tokens],
            "end_id": [spec.end_id],
            "pad_id": [spec.pad_id],
        }
        for name, vals in values.items():
            out[warmup_file_name(i, name)] = struct.pack(f"<{len(vals)}i", *vals)
    return out


def preprocessing_config(spec: TrtllmRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(name="preprocessing", backend="python", max_batch_size=r.scheduler.max_batch_size)
    _queue(cfg, r)
    cfg.input.extend(_io(mc.ModelInput, io.PREPROCESSING_INPUTS))
    cfg.output.extend(_io(mc.ModelOutput, io.PREPROCESSING_OUTPUTS))
    _params(
        cfg,
        {
            "tokenizer_dir": str(spec.tokenizer_dir),
            "add_special_tokens": _b(r.trtllm.add_special_tokens),
            "multimodal_model_path": "",  # model.py: "" = not multimodal
            "gpt_model_path": str(spec.engine_dir),
        },
    )
    _instances(cfg, r.trtllm.preprocessing_instance_count)
    return cfg


def postprocessing_config(spec: TrtllmRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(name="postprocessing", backend="python", max_batch_size=r.scheduler.max_batch_size)
    cfg.dynamic_batching.SetInParent()  # dynamic_batching {}
    cfg.input.extend(_io(mc.ModelInput, io.POSTPROCESSING_INPUTS))
    cfg.output.extend(_io(mc.ModelOutput, io.POSTPROCESSING_OUTPUTS))
    _params(
        cfg,
        {"tokenizer_dir": str(spec.tokenizer_dir), "skip_special_tokens": _b(r.trtllm.skip_special_tokens)},
    )
    _instances(cfg, r.trtllm.postprocessing_instance_count)
    return cfg


def bls_config(spec: TrtllmRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(name="tensorrt_llm_bls", backend="python", max_batch_size=r.scheduler.max_batch_size)
    cfg.model_transaction_policy.decoupled = True
    cfg.input.extend(_io(mc.ModelInput, io.BLS_INPUTS))
    cfg.output.extend(_io(mc.ModelOutput, io.BLS_OUTPUTS))
    _params(
        cfg,
        {
            "accumulate_tokens": _b(r.trtllm.accumulate_tokens),
            "tensorrt_llm_model_name": "tensorrt_llm",
            "tensorrt_llm_draft_model_name": "",  # model.py: "" = no draft model
            "multimodal_encoders_name": "",  # model.py: "" = no multimodal encoder
        },
    )
    _instances(cfg, r.trtllm.bls_instance_count)
    return cfg


def ensemble_config(spec: TrtllmRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=r.scheduler.max_batch_size)
    cfg.input.extend(_io(mc.ModelInput, io.ENSEMBLE_INPUTS))
    cfg.output.extend(_io(mc.ModelOutput, io.ENSEMBLE_OUTPUTS))
    for model, inputs, outputs in io.ENSEMBLE_STEPS:
        s = cfg.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        s.input_map.update(inputs)
        s.output_map.update(outputs)
    return cfg


def build_configs(spec: TrtllmRepoSpec) -> dict[str, mc.ModelConfig]:
    return {
        "ensemble": ensemble_config(spec),
        "preprocessing": preprocessing_config(spec),
        "tensorrt_llm": tensorrt_llm_config(spec),
        "postprocessing": postprocessing_config(spec),
        "tensorrt_llm_bls": bls_config(spec),
    }


def prompt_limit(recipe: Recipe) -> int:
    """The longest prompt the served model takes: the engine path is bounded by max_seq_len (trtllm-build
    ignores --max_input_len) minus the warmup's own output; the LLM API by limits.max_input_len."""
    if recipe.backend is Backend.TRTLLM:
        return recipe.limits.max_seq_len - recipe.warmup.max_tokens
    return recipe.limits.max_input_len


def tokenize_warmup(recipe: Recipe, tokenizer_dir: Path) -> tuple[list[list[int]], int, int]:
    """(token ids per warmup text: prefixes, then prompts; end_id, pad_id) exactly as the upstream preprocessing
    model computes them (HF AutoTokenizer, add_special_tokens), after the warmup rule (llmkiln.build.warmup_check:
    each prefix at least one KV block, every text within the prompt limit)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), legacy=False, padding_side="left")
    except (OSError, ValueError) as exc:
        raise BadInput(
            f"{tokenizer_dir}: cannot load the tokenizer with transformers.AutoTokenizer ({exc})"
        ) from exc
    end_id = tok.encode(tok.eos_token, add_special_tokens=False)[0]
    pad_token = tok.pad_token or tok.eos_token
    pad_id = tok.encode(pad_token, add_special_tokens=False)[0]
    special = recipe.trtllm.add_special_tokens if recipe.backend is Backend.TRTLLM else True

    def encode(texts: list[str]) -> list[list[int]]:
        return [tok.encode(t, add_special_tokens=special) for t in texts]

    prefixes, prompts = encode(recipe.warmup.prefixes), encode(recipe.warmup.prompts)
    check_warmup(recipe, [len(x) for x in prefixes], [len(x) for x in prompts], prompt_limit(recipe),
                 f"recipe {recipe.name}")  # fmt: skip
    return encode(recipe.warmup.texts()), end_id, pad_id


def config_text(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


def upstream_readme(model: str) -> str:
    files = "\n".join(f"- `{UPSTREAM_DIR}/{model}/1/{f}` → `{model}/1/{f}`" for f in PYTHON_MODELS[model])
    return (
        f"# {model}/1: files to copy from the pinned TensorRT-LLM\n\n"
        f"This python model runs NVIDIA's code of the pinned TensorRT-LLM {pins.pin('tensorrt_llm')} (see "
        "docs/gpu.md); llmkiln does not vendor it. `kiln build --resume PLAN` in the container "
        f"{pins.container()} takes it from {pins.pin('engine_model_files')} (or $LLMKILN_TRTLLM_MODELS):\n\n"
        f"{files}\n"
    )


def write_trtllm_repository(
    spec: TrtllmRepoSpec, out: Path, upstream_models: Path | None = None, overwrite: bool = False
) -> Path:
    """Write the five models into `out` (temp folder + rename). Returns `out`."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise BadInput(f"{out} exists; pass overwrite=True (kiln repo --force) to replace it")
    if (
        upstream_models is not None
        and not (upstream_models / "tensorrt_llm_bls" / "1" / "model.py").is_file()
    ):
        raise BadInput(
            f"{upstream_models}: not an inflight_batcher_llm folder (no tensorrt_llm_bls/1/model.py)"
        )
    with atomic_dir(out) as tmp:
        for name, cfg in build_configs(spec).items():
            model_dir = tmp / name
            (model_dir / "1").mkdir(parents=True)
            (model_dir / "config.pbtxt").write_text(config_text(cfg))
            if name in PYTHON_MODELS:
                if upstream_models is not None:
                    for rel in PYTHON_MODELS[name]:
                        dst = model_dir / "1" / rel
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(upstream_models / name / "1" / rel, dst)
                else:
                    (model_dir / "1" / "UPSTREAM.md").write_text(upstream_readme(name))
        files = warmup_files(spec)
        if files:
            (tmp / "tensorrt_llm" / WARMUP_DIR).mkdir()
            for fname, data in files.items():
                (tmp / "tensorrt_llm" / WARMUP_DIR / fname).write_bytes(data)
    return out
