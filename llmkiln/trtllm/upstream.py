"""The container's own model files against what llmkiln generates: compare, then take them in.

The python models (tensorrtllm model set: preprocessing, postprocessing, tensorrt_llm_bls; LLM API: the llmapi
`tensorrt_llm` model) run NVIDIA's code of the pinned generation, which the container ships under
/app/all_models (pins.json engine_model_files / llmapi_model_files; $LLMKILN_TRTLLM_MODELS overrides the engine
path's folder). Before llmkiln serves its generated config.pbtxt next to that code, `compare(repo, upstream)`
parses the container's config.pbtxt templates (placeholders `${...}` filled with neutral literals) and reports
every input/output name and parameter key that differs, naming the model, the key and both files; a mismatch
is bad input (exit 2): the code would read a tensor or parameter llmkiln does not write, or the reverse.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BadInput
from llmkiln.trtllm import llmapi_repo, pins
from llmkiln.trtllm.model_io import OMITTED_PARAMETERS
from llmkiln.trtllm.repository import MODELS, PYTHON_MODELS

MODELS_ENV = "LLMKILN_TRTLLM_MODELS"  # the container's inflight_batcher_llm folder, when not the pinned path
LLMAPI_MODELS_ENV = "LLMKILN_TRTLLM_LLMAPI_MODELS"  # the container's all_models/llmapi folder, likewise

_PLACEHOLDER = re.compile(r"(?P<key>\w+)\s*:\s*(?P<open>\[?\s*)\$\{(?P<name>\w+)\}")


def repo_kind(repo: Path) -> str:
    """'engine' (tensorrtllm model set), 'llmapi', or 'cpu' (llmkiln's own python model)."""
    repo = Path(repo)
    if (repo / "ensemble" / "config.pbtxt").is_file():
        return "engine"
    if (repo / llmapi_repo.MODEL / "1" / llmapi_repo.MODEL_YAML).is_file():
        return "llmapi"
    return "cpu"


def default_upstream(kind: str) -> Path:
    """Where the container keeps the model files of this repository kind ($LLMKILN_TRTLLM_MODELS, or
    $LLMKILN_TRTLLM_LLMAPI_MODELS for the llmapi model, first)."""
    if kind == "engine":
        return Path(os.environ.get(MODELS_ENV) or pins.pin("engine_model_files"))
    return Path(os.environ.get(LLMAPI_MODELS_ENV) or Path(pins.pin("llmapi_model_files")).parent)


def parse_template(path: Path) -> mc.ModelConfig:
    """An upstream config.pbtxt, its unquoted `${...}` placeholders replaced so protobuf can parse it."""

    def fill(m: re.Match[str]) -> str:
        key = m.group("key")
        literal = "TYPE_FP32" if key == "data_type" else "true" if key == "decoupled" else "1"
        return f"{key}: {m.group('open')}{literal}"

    text = _PLACEHOLDER.sub(fill, path.read_text(encoding="utf-8"))
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise BadInput(
            f"{path}: the container's config.pbtxt does not parse as a ModelConfig ({exc})"
        ) from exc


def _diff(model: str, ours: mc.ModelConfig, theirs: mc.ModelConfig, where: str) -> list[str]:
    out = []
    pairs = (
        ("input", {i.name for i in ours.input}, {i.name for i in theirs.input}),
        ("output", {o.name for o in ours.output}, {o.name for o in theirs.output}),
        ("parameter", set(ours.parameters), set(theirs.parameters)),
    )
    for what, mine, upstream in pairs:
        for key in sorted(upstream - mine):
            out.append(
                f"{model}: {what} {key!r} is in the container's {where} but not in llmkiln's config.pbtxt"
            )
        for key in sorted(mine - upstream):
            out.append(
                f"{model}: {what} {key!r} is in llmkiln's config.pbtxt but not in the container's {where}"
            )
    return out


def compare(repo: Path, upstream: Path) -> list[str]:
    """Every I/O name and parameter key that differs between the generated repository and the container's."""
    repo, upstream = Path(repo), Path(upstream)
    kind = repo_kind(repo)
    if not upstream.is_dir():
        raise BadInput(f"{upstream}: no such folder (the container keeps the model files there; "
                       f"set ${MODELS_ENV} for another place)")  # fmt: skip
    models = MODELS if kind == "engine" else (llmapi_repo.MODEL,) if kind == "llmapi" else ()
    if not models:
        raise BadInput(
            f"{repo}: not a TensorRT-LLM repository (no ensemble/ nor {llmapi_repo.MODEL}/1/model.yaml)"
        )
    problems = []
    for model in models:
        theirs_path = upstream / model / "config.pbtxt"
        if not theirs_path.is_file():
            problems.append(f"{model}: the container has no {theirs_path}")
            continue
        ours = text_format.Parse((repo / model / "config.pbtxt").read_text(), mc.ModelConfig())
        theirs = parse_template(theirs_path)
        # Parameters llmkiln leaves out on purpose (io.OMITTED_PARAMETERS, with the reason) are not mismatches.
        for key in OMITTED_PARAMETERS.get(model, {}) | {"max_tokens_in_paged_kv_cache": ""}:
            if key in theirs.parameters and key not in ours.parameters:
                del theirs.parameters[key]
        problems += _diff(model, ours, theirs, str(theirs_path))
    return problems


def container_folder(kind: str) -> Path | None:
    """The container's model files when this host has them ($LLMKILN_TRTLLM_MODELS or the pinned path)."""
    folder = default_upstream(kind)
    return folder if folder.is_dir() else None


def require_match(repo: Path, upstream: Path) -> None:
    """BadInput naming every I/O name or parameter key that differs from the container's config.pbtxt."""
    problems = compare(repo, upstream)
    if problems:
        raise BadInput(f"{repo}: the generated config.pbtxt files do not match the container's model files "
                       f"({upstream}):\n  " + "\n  ".join(problems))  # fmt: skip


def files_to_take(kind: str) -> dict[str, tuple[str, ...]]:
    return dict(PYTHON_MODELS) if kind == "engine" else {llmapi_repo.MODEL: llmapi_repo.UPSTREAM_FILES}


def check_and_take(repo: Path, upstream: Path | None = None, take: bool = True) -> list[str]:
    """Compare with the container's files (BadInput listing every mismatch), then copy its python model code
    into the repository (each file written atomically). Returns the files taken."""
    repo = Path(repo)
    kind = repo_kind(repo)
    upstream = Path(upstream) if upstream is not None else default_upstream(kind)
    require_match(repo, upstream)
    taken = []
    for model, rels in files_to_take(kind).items():
        for rel in rels:
            src = upstream / model / "1" / rel
            if not src.is_file():
                raise BadInput(f"{src}: missing in the container's model files")
            if take:
                dst = repo / model / "1" / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(dst, src.read_text(encoding="utf-8"))
                shutil.copymode(src, dst)
                taken.append(f"{model}/1/{rel}")
    return taken
