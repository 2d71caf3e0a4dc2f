"""The Triton repository of TensorRT-LLM's `llmapi` python model (backend trtllm-llmapi), built as protobuf.

Layout (one model, named `tensorrt_llm` as upstream):
  triton_repo/tensorrt_llm/config.pbtxt     model_config_pb2.ModelConfig: the upstream I/O names and types,
                                            instance_group, model_warmup (the recipe's prefixes, then prompts)
  triton_repo/tensorrt_llm/1/model.yaml     LLM(**kwargs): model (the HF checkpoint), backend pytorch, the
                                            recipe's llm_api_options, and triton_config {max_batch_size 0,
                                            decoupled true} that upstream's model.py applies in
                                            auto_complete_config (so config.pbtxt leaves both unset)
  triton_repo/tensorrt_llm/warmup/*         raw warmup tensors
  triton_repo/tensorrt_llm/1/UPSTREAM.md    model.py and helpers.py come from the pinned container
                                            (/app/all_models/llmapi/tensorrt_llm/1/) at deploy time: llmkiln never
                                            ships NVIDIA's code (`kiln repo --check DIR --upstream-models ...
                                            --take-model-files`, scripts/gpu_verify.sh)

I/O transcribed from NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt at c8c6df0
(the 2025 template: no LoRA / image inputs, which later main versions add); the deploy-time comparison with the
container's own config.pbtxt (llmkiln.trtllm.upstream) catches any difference in the pinned generation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.atomic import atomic_dir
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.facts import check_options
from llmkiln.trtllm.llmapi import llm_api_options

T = mc.DataType
MODEL = "tensorrt_llm"
WARMUP_DIR = "warmup"
UPSTREAM_FILES = ("model.py", "helpers.py")  # in <model>/1/, from the container
MODEL_YAML = "model.yaml"

# (name, data type, dims, optional)
LLMAPI_INPUTS: list[tuple[str, int, tuple[int, ...], bool]] = [
    ("text_input", T.TYPE_STRING, (-1,), False),
    ("streaming", T.TYPE_BOOL, (1,), True),
    ("sampling_param_best_of", T.TYPE_INT32, (1,), True),
    ("sampling_param_temperature", T.TYPE_FP32, (1,), True),
    ("sampling_param_top_k", T.TYPE_INT32, (1,), True),
    ("sampling_param_top_p", T.TYPE_FP32, (1,), True),
    ("sampling_param_frequency_penalty", T.TYPE_FP32, (1,), True),
    ("sampling_param_presence_penalty", T.TYPE_FP32, (1,), True),
    ("sampling_param_max_tokens", T.TYPE_INT32, (1,), True),
    ("sampling_param_stop", T.TYPE_STRING, (-1,), True),
    ("sampling_param_seed", T.TYPE_UINT64, (1,), True),
    ("sampling_param_exclude_input_from_output", T.TYPE_BOOL, (1,), True),
    ("sampling_param_return_perf_metrics", T.TYPE_BOOL, (1,), True),
    ("return_finish_reason", T.TYPE_BOOL, (1,), True),
    ("return_stop_reason", T.TYPE_BOOL, (1,), True),
    ("return_cumulative_logprob", T.TYPE_BOOL, (1,), True),
    ("stop", T.TYPE_BOOL, (1,), True),
]
LLMAPI_OUTPUTS: list[tuple[str, int, tuple[int, ...]]] = [
    ("text_output", T.TYPE_STRING, (-1,)),
    ("finish_reason", T.TYPE_STRING, (-1,)),
    ("stop_reason", T.TYPE_STRING, (-1,)),
    ("cumulative_logprob", T.TYPE_FP32, (-1,)),
    ("kv_cache_reused_block", T.TYPE_INT32, (-1,)),
    ("kv_cache_missed_block", T.TYPE_INT32, (-1,)),
    ("kv_cache_alloc_new_blocks", T.TYPE_INT32, (-1,)),
    ("kv_cache_alloc_total_blocks", T.TYPE_INT32, (-1,)),
    ("kv_cache_hit_rate", T.TYPE_FP32, (-1,)),
    ("arrival_time_ns", T.TYPE_INT64, (1,)),
    ("first_scheduled_time_ns", T.TYPE_INT64, (1,)),
    ("first_token_time_ns", T.TYPE_INT64, (1,)),
    ("last_token_time_ns", T.TYPE_INT64, (1,)),
    ("acceptance_rate", T.TYPE_FP32, (1,)),
    ("total_accepted_draft_tokens", T.TYPE_INT32, (1,)),
    ("total_draft_tokens", T.TYPE_INT32, (1,)),
]
# Parameters upstream's config.pbtxt carries (none; gpu_device_ids is read only in multi-instance mode).
LLMAPI_PARAMETERS: tuple[str, ...] = ()


@dataclass
class LlmapiRepoSpec:
    """What the llmapi repository needs; `checkpoint_dir` is where the HF checkpoint is on the serving host."""

    recipe: Recipe
    checkpoint_dir: Path


def model_yaml(spec: LlmapiRepoSpec) -> dict[str, Any]:
    options = llm_api_options(spec.recipe)
    doc: dict[str, Any] = {"model": str(spec.checkpoint_dir), "backend": "pytorch", **options}
    check_options(doc, f"{MODEL}/1/{MODEL_YAML}")
    # decoupled: streaming responses (upstream's model.py refuses `streaming` otherwise)
    doc["triton_config"] = {"max_batch_size": 0, "decoupled": True}
    return doc


def llmapi_config(spec: LlmapiRepoSpec) -> mc.ModelConfig:
    r = spec.recipe
    cfg = mc.ModelConfig(name=MODEL, backend="python")
    for name, dtype, dims, optional in LLMAPI_INPUTS:
        cfg.input.append(mc.ModelInput(name=name, data_type=dtype, dims=list(dims), optional=optional))
    for name, dtype, dims in LLMAPI_OUTPUTS:
        cfg.output.append(mc.ModelOutput(name=name, data_type=dtype, dims=list(dims)))
    cfg.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    for i, _text in enumerate(r.warmup.texts()):
        w = cfg.model_warmup.add(name=f"warmup_{i}", batch_size=1, count=r.warmup.count)
        w.inputs["text_input"].data_type = T.TYPE_STRING
        w.inputs["text_input"].dims.append(1)
        w.inputs["text_input"].input_data_file = f"text_input_{i}"
        w.inputs["sampling_param_max_tokens"].data_type = T.TYPE_INT32
        w.inputs["sampling_param_max_tokens"].dims.append(1)
        w.inputs["sampling_param_max_tokens"].input_data_file = "max_tokens"
    return cfg


def warmup_files(recipe: Recipe) -> dict[str, bytes]:
    """TYPE_STRING = 4-byte little-endian length + UTF-8 bytes; INT32 little-endian (Triton input_data_file)."""
    texts = recipe.warmup.texts()
    files = {f"text_input_{i}": struct.pack("<I", len(t.encode())) + t.encode() for i, t in enumerate(texts)}
    if texts:
        files["max_tokens"] = struct.pack("<i", recipe.warmup.max_tokens)
    return files


def upstream_readme() -> str:
    where = pins.pin("llmapi_model_files")
    return (
        f"# {MODEL}/1: files taken from the pinned container at deploy time\n\n"
        f"`{', '.join(UPSTREAM_FILES)}` are NVIDIA's llmapi python model of TensorRT-LLM {pins.pin('tensorrt_llm')}; "
        f"llmkiln does not ship them. In the container {pins.container()}:\n\n"
        f"    kiln repo --check triton_repo --upstream-models {Path(where).parent} --take-model-files\n\n"
        "compares the container's config.pbtxt with this one (I/O names, parameters) and copies them in.\n"
    )


def write_llmapi_repository(spec: LlmapiRepoSpec, out: Path) -> Path:
    """Write the repository into `out` (temp folder + rename, replacing an older one). Returns `out`."""
    with atomic_dir(Path(out)) as tmp:
        model_dir = tmp / MODEL
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(llmapi_config(spec)))
        (model_dir / "1" / MODEL_YAML).write_text(
            "# LLM(**kwargs) for TensorRT-LLM's llmapi Triton model, written by llmkiln from the recipe\n"
            + yaml.safe_dump(model_yaml(spec), sort_keys=False)
        )
        (model_dir / "1" / "UPSTREAM.md").write_text(upstream_readme())
        files = warmup_files(spec.recipe)
        if files:
            (model_dir / WARMUP_DIR).mkdir()
            for name, data in files.items():
                (model_dir / WARMUP_DIR / name).write_bytes(data)
    problems = check_llmapi_repository(Path(out))
    if problems:
        raise BadInput(f"{out}: generated llmapi repository is invalid:\n  " + "\n  ".join(problems))
    return Path(out)


def load_llmapi_config(repo: Path) -> mc.ModelConfig:
    path = Path(repo) / MODEL / "config.pbtxt"
    if not path.is_file():
        raise BadInput(f"{repo}: no {MODEL}/config.pbtxt (not an llmapi repository)")
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except text_format.ParseError as exc:
        raise BadInput(f"{path}: not a valid ModelConfig ({exc})") from exc


def check_llmapi_repository(repo: Path, require_model_files: bool = False) -> list[str]:
    """Problems of an llmapi repository (empty = valid): config parses, I/O names as upstream, warmup files
    present and sized, model.yaml keys known to the pinned TensorRT-LLM, optionally the upstream files there."""
    repo = Path(repo)
    cfg = load_llmapi_config(repo)
    problems = []
    want_in = {n for n, *_ in LLMAPI_INPUTS}
    want_out = {n for n, *_ in LLMAPI_OUTPUTS}
    have_in, have_out = {i.name for i in cfg.input}, {o.name for o in cfg.output}
    problems += [f"{MODEL}: input {n!r} missing" for n in sorted(want_in - have_in)]
    problems += [f"{MODEL}: unknown input {n!r}" for n in sorted(have_in - want_in)]
    problems += [f"{MODEL}: output {n!r} missing" for n in sorted(want_out - have_out)]
    problems += [f"{MODEL}: unknown output {n!r}" for n in sorted(have_out - want_out)]
    if cfg.max_batch_size or cfg.HasField("model_transaction_policy"):
        problems.append(f"{MODEL}: max_batch_size / decoupled belong in 1/{MODEL_YAML} triton_config (upstream "
                        "model.py sets them in auto_complete_config and cannot override config.pbtxt)")  # fmt: skip
    for w in cfg.model_warmup:
        for name, inp in w.inputs.items():
            if name not in have_in:
                problems.append(f"{MODEL} warmup {w.name}: {name!r} is not an input")
            f = repo / MODEL / WARMUP_DIR / inp.input_data_file
            if not f.is_file():
                problems.append(f"{MODEL} warmup {w.name}: file {f} is missing")
    yaml_path = repo / MODEL / "1" / MODEL_YAML
    if not yaml_path.is_file():
        problems.append(f"{yaml_path} is missing")
    else:
        doc = yaml.safe_load(yaml_path.read_text()) or {}
        tc = doc.pop("triton_config", None)
        if not isinstance(tc, dict) or "max_batch_size" not in tc or "decoupled" not in tc:
            problems.append(
                f"{yaml_path}: triton_config needs max_batch_size and decoupled (upstream model.py)"
            )
        try:
            check_options(doc, str(yaml_path))
        except BadInput as exc:
            problems.append(str(exc))
    if require_model_files:
        for rel in UPSTREAM_FILES:
            if not (repo / MODEL / "1" / rel).is_file():
                problems.append(f"{MODEL}/1/{rel} is missing: take it from the container (UPSTREAM.md)")
    return problems
