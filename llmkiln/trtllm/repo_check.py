"""Parse and validate a tensorrtllm Triton repository written by trtllm_repository (or by hand).

Checks: the five models parse as model_config_pb2.ModelConfig; no `${` anywhere; every upstream template
parameter is filled or deliberately omitted; tensorrt_llm and tensorrt_llm_bls are decoupled; batch sizes agree;
the ensemble wiring is closed (every mapped tensor exists on both sides); tensorrt_llm's model_warmup files exist
with the byte size their dims imply; optionally the engine folder and the upstream python model files exist.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.errors import BadInput
from llmkiln.trtllm import model_io as io
from llmkiln.trtllm.repository import MODELS, PYTHON_MODELS, WARMUP_DIR

ALWAYS_FILLED = {
    "tensorrt_llm": ("gpt_model_path", "gpt_model_type", "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction",
                     "enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output", "cuda_graph_mode",
                     "cuda_graph_cache_size", "max_beam_width", "tokenizer_dir", "guided_decoding_backend",
                     "xgrammar_tokenizer_info_path"),
    "preprocessing": ("tokenizer_dir", "add_special_tokens", "multimodal_model_path"),
    "postprocessing": ("tokenizer_dir", "skip_special_tokens"),
    "tensorrt_llm_bls": ("accumulate_tokens", "tensorrt_llm_model_name"),
}  # fmt: skip
OPTIONALLY_OMITTED = {"tensorrt_llm": {"max_tokens_in_paged_kv_cache"}}


def load_configs(repo: Path) -> dict[str, mc.ModelConfig]:
    """{model: parsed config}; BadInput naming the file when a model is missing or does not parse."""
    out = {}
    for name in MODELS:
        path = Path(repo) / name / "config.pbtxt"
        if not path.is_file():
            raise BadInput(f"{repo}: model {name!r} is missing ({path})")
        text = path.read_text()
        if "${" in text:
            raise BadInput(
                f"{path}: an unfilled template placeholder is left: {text[text.index('${') :][:40]!r}"
            )
        try:
            out[name] = text_format.Parse(text, mc.ModelConfig())
        except text_format.ParseError as exc:
            raise BadInput(f"{path}: not a valid ModelConfig ({exc})") from exc
    return out


def _param_problems(name: str, cfg: mc.ModelConfig) -> list[str]:
    problems = []
    keys = set(cfg.parameters)
    upstream = set(io.UPSTREAM_PARAMETERS[name])
    omitted = set(io.OMITTED_PARAMETERS.get(name, {})) | OPTIONALLY_OMITTED.get(name, set())
    for key in sorted(upstream - keys - omitted):
        problems.append(f"{name}: parameter {key!r} is neither filled nor in the documented omitted set")
    for key in sorted(keys - upstream):
        problems.append(f"{name}: parameter {key!r} is not a parameter of the pinned template")
    for key in ALWAYS_FILLED.get(name, ()):
        if key not in keys:
            problems.append(f"{name}: required parameter {key!r} is missing")
    for key in ALWAYS_FILLED.get(name, ()):
        if (
            key in keys
            and not cfg.parameters[key].string_value
            and key
            not in (
                "guided_decoding_backend",
                "xgrammar_tokenizer_info_path",
                "multimodal_model_path",
            )
        ):
            problems.append(f"{name}: required parameter {key!r} is empty")
    return problems


def _ensemble_problems(cfgs: dict[str, mc.ModelConfig]) -> list[str]:
    problems = []
    ens = cfgs["ensemble"]
    available = {i.name for i in ens.input}
    for s in ens.ensemble_scheduling.step:
        model = cfgs.get(s.model_name)
        if model is None:
            problems.append(f"ensemble: step model {s.model_name!r} is not in the repository")
            continue
        inputs, outputs = {i.name for i in model.input}, {o.name for o in model.output}
        for key, value in s.input_map.items():
            if key not in inputs:
                problems.append(f"ensemble: {s.model_name} has no input {key!r}")
            if value not in available:
                problems.append(
                    f"ensemble: tensor {value!r} (→ {s.model_name}.{key}) is produced by no earlier step"
                )
        for key, value in s.output_map.items():
            if key not in outputs:
                problems.append(f"ensemble: {s.model_name} has no output {key!r}")
            available.add(value)
        required = {i.name for i in model.input if not i.optional}
        for key in sorted(required - set(s.input_map)):
            problems.append(f"ensemble: required input {s.model_name}.{key} is not mapped")
    for o in ens.output:
        if o.name not in available:
            problems.append(f"ensemble: output {o.name!r} is produced by no step")
    return problems


def _warmup_problems(repo: Path, cfg: mc.ModelConfig) -> list[str]:
    problems = []
    if not cfg.model_warmup:
        return ["tensorrt_llm: no model_warmup (the recipe's warmup.prompts is empty)"]
    inputs = {i.name for i in cfg.input}
    for w in cfg.model_warmup:
        for name, inp in w.inputs.items():
            if name not in inputs:
                problems.append(f"tensorrt_llm warmup {w.name}: {name!r} is not an input")
            f = repo / "tensorrt_llm" / WARMUP_DIR / inp.input_data_file
            n = 1
            for d in inp.dims:
                n *= d
            if not f.is_file():
                problems.append(f"tensorrt_llm warmup {w.name}: file {f} is missing")
            elif f.stat().st_size != 4 * n:
                problems.append(
                    f"tensorrt_llm warmup {w.name}: {f.name} has {f.stat().st_size} bytes, want {4 * n}"
                )
    return problems


def check_trtllm_repository(
    repo: Path, check_paths: bool = False, require_model_files: bool = False
) -> list[str]:
    """Problems found (empty = valid). `check_paths`: the engine/tokenizer folders exist on this host."""
    repo = Path(repo)
    cfgs = load_configs(repo)
    problems: list[str] = []
    for name, cfg in cfgs.items():
        problems += _param_problems(name, cfg)
    for name in ("tensorrt_llm", "tensorrt_llm_bls"):
        if not cfgs[name].model_transaction_policy.decoupled:
            problems.append(
                f"{name}: not decoupled; streaming needs model_transaction_policy.decoupled: true"
            )
    sizes = {n: c.max_batch_size for n, c in cfgs.items()}
    if len(set(sizes.values())) != 1:
        problems.append(f"max_batch_size differs between models: {sizes}")
    problems += _ensemble_problems(cfgs)
    problems += _warmup_problems(repo, cfgs["tensorrt_llm"])
    if check_paths:
        engine = Path(cfgs["tensorrt_llm"].parameters["gpt_model_path"].string_value)
        if not (engine / "config.json").is_file():
            problems.append(
                f"tensorrt_llm: gpt_model_path {engine} has no config.json (engine not built here)"
            )
        tok = Path(cfgs["preprocessing"].parameters["tokenizer_dir"].string_value)
        if not tok.is_dir():
            problems.append(f"preprocessing: tokenizer_dir {tok} does not exist")
    if require_model_files:
        for name, files in PYTHON_MODELS.items():
            for rel in files:
                if not (repo / name / "1" / rel).is_file():
                    problems.append(
                        f"{name}/1/{rel} is missing: copy it from the pinned TensorRT-LLM (UPSTREAM.md)"
                    )
    return problems
