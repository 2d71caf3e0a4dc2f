"""The Triton model repository for a CPU engine: config.pbtxt built as a protobuf message, never a template.

Layout written by `write_repository` (the model folder is built in a hidden `.tmp-repo@<pid>-*` folder inside
`<out>` and renamed into place: nothing is written outside `<out>`, and a failure leaves nothing behind):
  <out>/<model_name>/config.pbtxt        ModelConfig (tritonclient's model_config_pb2) via text_format
  <out>/<model_name>/1/model.py          copy of llmkiln/serve/model.py (thin; imports llmkiln from the venv)
The warmup section travels as the parameter `warmup` (JSON); the engine host runs it inside the model's
initialize(), so the model is READY only once warm (no model_warmup samples: the host owns the warmup).

The model I/O follows the tensorrtllm_backend ensemble (max_batch_size >= 1, dims [1]) so its clients and
genai-perf (`--backend tensorrtllm`) work unchanged. `check_repository` parses and validates a repository.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.atomic import remove_dead_writers
from llmkiln.engine_dir import RESOLVED_RECIPE, EngineDir
from llmkiln.errors import BadInput
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import MODEL_NAME_PATTERN, Warmup

MODEL_FILE = Path(__file__).with_name("model.py")
VERSION = "1"

T = mc.DataType
# name -> (data type, dims, optional). Order = the order in config.pbtxt.
INPUTS: dict[str, tuple[int, list[int], bool]] = {
    "text_input": (T.TYPE_STRING, [1], False),
    "max_tokens": (T.TYPE_INT32, [1], False),
    "stream": (T.TYPE_BOOL, [1], True),
    "exclude_input_in_output": (T.TYPE_BOOL, [1], True),
    "temperature": (T.TYPE_FP32, [1], True),
    "top_p": (T.TYPE_FP32, [1], True),
    "top_k": (T.TYPE_INT32, [1], True),
    "random_seed": (T.TYPE_UINT64, [1], True),
    "seed": (T.TYPE_UINT64, [1], True),
    "end_id": (T.TYPE_INT32, [1], True),
    "stop_words": (T.TYPE_STRING, [-1], True),
    "priority": (T.TYPE_INT32, [1], True),
    "return_perf_metrics": (T.TYPE_BOOL, [1], True),
    "num_speculative_tokens": (T.TYPE_INT32, [1], True),
    # a decode-role model: the prefill-role model's hand-off (its `disaggregated_params` output, as sent)
    "disaggregated_params": (T.TYPE_STRING, [1], True),
}
OUTPUTS: dict[str, tuple[int, list[int]]] = {
    "text_output": (T.TYPE_STRING, [-1]),
    "arrival_time_ns": (T.TYPE_INT64, [1]),
    "first_scheduled_time_ns": (T.TYPE_INT64, [1]),
    "first_token_time_ns": (T.TYPE_INT64, [1]),
    "last_token_time_ns": (T.TYPE_INT64, [1]),
    "kv_cache_reused_blocks": (T.TYPE_INT32, [1]),
    "kv_cache_reused_tokens": (T.TYPE_INT32, [1]),
    "num_input_tokens": (T.TYPE_INT32, [1]),
    "num_output_tokens": (T.TYPE_INT32, [1]),
    # a prefill-role model's final response: the hand-off for the decode-role model (JSON, llmkiln.host)
    "disaggregated_params": (T.TYPE_STRING, [1]),
}
REQUIRED_PARAMETERS = ("engine_dir",)


@dataclass
class RepoSpec:
    """What goes into one model's config.pbtxt."""

    model_name: str
    engine_dir: Path
    warmup: Warmup = field(default_factory=Warmup)
    exclude_input_in_output: bool = False
    max_batch_size: int = 1
    # nested recipe overrides for the runtime, e.g. {"scheduler": {"max_batch_size": 4}}
    engine_overrides: dict[str, Any] | None = None
    # the file the launcher writes to make the model drain (ServeCore; TritonServer.drain)
    drain_file: Path | None = None
    heartbeat_file: Path | None = (
        None  # the stub's heartbeat (llmkiln.serve.heartbeat); None: no liveness check
    )
    # the part of a request's life the model serves (llmkiln.host.roles) and, for prefill and decode, how its
    # KV moves (checked together by HostOptions before anything is written)
    role: WorkerRole = WorkerRole.AGGREGATED
    kv: KvTransferOptions = field(default_factory=KvTransferOptions)

    def __post_init__(self) -> None:
        check_model_name(self.model_name)
        HostOptions(role=self.role, kv=self.kv)  # BadInput naming the flag: KV options on an aggregated model


def check_model_name(name: str) -> str:
    """`name` when it is a safe Triton model name (MODEL_NAME_PATTERN), else BadInput: the name becomes a folder
    of the repository, so '..' or 'a/b' would write outside it."""
    if not isinstance(name, str) or re.fullmatch(MODEL_NAME_PATTERN, name) is None:
        shown = repr(name)[:80]
        raise BadInput(
            f"model name {shown} (serve.model_name or --model-name): a Triton model name is 1-128 letters, digits, "
            "'_', '.' or '-', not starting with '.' or '-' (no path parts such as '..' or '/')"
        )
    return name


def spec_from_engine(
    engine: EngineDir | Path,
    model_name: str | None = None,
    role: WorkerRole = WorkerRole.AGGREGATED,
    kv: KvTransferOptions | None = None,
) -> RepoSpec:
    """The engine's resolved recipe turned into a RepoSpec (its warmup and serve sections), in `role` (the warmup
    runs on the engine itself in every role: it exports and imports nothing)."""
    folder = engine if isinstance(engine, EngineDir) else EngineDir(Path(engine))
    recipe = folder.runtime_recipe()
    return RepoSpec(
        model_name=model_name or recipe.serve.model_name,
        engine_dir=folder.path.resolve(),
        warmup=recipe.warmup,
        role=role,
        kv=kv or KvTransferOptions(),
    )


def build_model_config(spec: RepoSpec) -> mc.ModelConfig:
    """The ModelConfig message for the llmkiln python-backend model (decoupled; the warmup as a parameter)."""
    cfg = mc.ModelConfig(name=spec.model_name, backend="python", max_batch_size=spec.max_batch_size)
    cfg.model_transaction_policy.decoupled = True
    for name, (dtype, dims, optional) in INPUTS.items():
        cfg.input.append(mc.ModelInput(name=name, data_type=dtype, dims=dims, optional=optional))
    for name, (dtype, dims) in OUTPUTS.items():
        cfg.output.append(mc.ModelOutput(name=name, data_type=dtype, dims=dims))
    cfg.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    params = {
        "engine_dir": str(spec.engine_dir),
        "exclude_input_in_output": "true" if spec.exclude_input_in_output else "false",
        "warmup": spec.warmup.model_dump_json(),
    }
    if spec.engine_overrides:
        params["engine_overrides"] = json.dumps(spec.engine_overrides, sort_keys=True)
    if spec.drain_file is not None:
        params["drain_file"] = str(spec.drain_file)
    if spec.heartbeat_file is not None:
        params["heartbeat_file"] = str(spec.heartbeat_file)
    params["role"] = spec.role.value
    if spec.role.moves_kv:
        params["kv_transfer"] = json.dumps(dataclasses.asdict(spec.kv), sort_keys=True)
    for key, value in params.items():
        cfg.parameters[key].string_value = value
    return cfg


def role_options(params: dict[str, str]) -> HostOptions:
    """The role and KV transfer options a model's parameters give (`role`, `kv_transfer` JSON; none: aggregated),
    checked as HostOptions checks them; BadInput or ValueError naming the parameter."""
    raw_role = params.get("role") or WorkerRole.AGGREGATED.value
    try:
        role = WorkerRole(raw_role)
    except ValueError:
        raise BadInput(
            f"parameter role={raw_role!r}: give one of {', '.join(r.value for r in WorkerRole)}"
        ) from None
    raw_kv = params.get("kv_transfer")
    if not raw_kv:
        return HostOptions(role=role)
    try:
        fields = json.loads(raw_kv)
        kv = KvTransferOptions(**fields)
    except (json.JSONDecodeError, TypeError) as exc:
        raise BadInput(
            f"parameter kv_transfer is not a JSON object of KV transfer options "
            f"({', '.join(f.name for f in dataclasses.fields(KvTransferOptions))}): {exc}"
        ) from None
    return HostOptions(role=role, kv=kv)


def config_text(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


TMP_PREFIX = ".tmp-repo@"
_TMP_OWNER = re.compile(r"^\.tmp-repo@(\d+)-")


def write_repository(spec: RepoSpec, out: Path, overwrite: bool = False) -> Path:
    """Write the repository to `out` and return the model folder. The model folder is built in a hidden temp
    folder inside `out`, checked, and renamed into place; nothing is written outside `out`, and on any failure
    nothing is left (folders this call created are removed again). `overwrite` replaces what `out` held."""
    out = Path(out)
    check_model_name(spec.model_name)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out}: exists and is not a folder; choose another -o folder")
    remove_dead_writers(out, _TMP_OWNER)  # left by a killed writer
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BadInput(f"{out}: exists and is not empty; choose another -o folder or remove it")
    EngineDir(spec.engine_dir).require()
    created: Path | None = None  # the topmost folder this call creates, removed again on failure
    if not out.exists():
        created = out
        while not created.parent.exists():
            created = created.parent
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    try:
        model_dir = tmp / spec.model_name
        (model_dir / VERSION).mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config_text(build_model_config(spec)))
        shutil.copy2(MODEL_FILE, model_dir / VERSION / "model.py")
        check_repository(tmp)
        _publish(model_dir, out, tmp)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / spec.model_name


def _publish(model_dir: Path, out: Path, tmp: Path) -> None:
    """Rename `model_dir` to out/<name>; what `out` held before (overwrite) is moved into `tmp` first (and put
    back if the rename fails), so `out` never shows a mix of old and new."""
    aside = tmp / ".old"
    aside.mkdir()
    moved = [e for e in out.iterdir() if e != tmp]
    for entry in moved:
        entry.rename(aside / entry.name)
    try:
        model_dir.rename(out / model_dir.name)
    except BaseException:
        for entry in moved:
            (aside / entry.name).rename(entry)
        raise


# ---------------------------------------------------------------------------------------------------------------
# Checking an existing repository


@dataclass
class CheckedModel:
    """One model of a checked repository."""

    name: str
    config: mc.ModelConfig
    engine_dir: Path


def _problems(model_dir: Path, cfg: mc.ModelConfig) -> list[str]:
    where = f"{model_dir / 'config.pbtxt'}"
    out: list[str] = []
    if cfg.name and cfg.name != model_dir.name:
        out.append(
            f"{where}: field 'name' is {cfg.name!r} but the folder is {model_dir.name!r}; make them equal"
        )
    if cfg.backend != "python":
        out.append(f"{where}: field 'backend' is {cfg.backend!r}; the llmkiln model needs 'python'")
    if not cfg.model_transaction_policy.decoupled:
        out.append(f"{where}: model_transaction_policy.decoupled must be true (streaming responses)")
    if cfg.max_batch_size < 1:
        out.append(f"{where}: max_batch_size must be >= 1 (tensorrtllm-ensemble shapes [batch, 1])")
    have_in = {i.name: i for i in cfg.input}
    for name, (dtype, _dims, optional) in INPUTS.items():
        got = have_in.get(name)
        if got is None:
            if not optional:
                out.append(f"{where}: required input {name!r} is missing")
            continue
        if got.data_type != dtype:
            out.append(
                f"{where}: input {name!r} has data_type {T.Name(got.data_type)}, expected {T.Name(dtype)}"
            )
    for name in have_in:
        if name not in INPUTS:
            out.append(f"{where}: unknown input {name!r}; the model reads only {', '.join(INPUTS)}")
    have_out = {o.name: o for o in cfg.output}
    if "text_output" not in have_out:
        out.append(f"{where}: output 'text_output' is missing")
    for name, o in have_out.items():
        if name not in OUTPUTS:
            out.append(f"{where}: unknown output {name!r}")
        elif o.data_type != OUTPUTS[name][0]:
            out.append(
                f"{where}: output {name!r} has data_type {T.Name(o.data_type)}, expected {T.Name(OUTPUTS[name][0])}"
            )
    for key in REQUIRED_PARAMETERS:
        if key not in cfg.parameters or not cfg.parameters[key].string_value:
            out.append(f"{where}: parameters {{ key: {key!r} }} is missing")
    engine_dir = Path(cfg.parameters["engine_dir"].string_value) if "engine_dir" in cfg.parameters else None
    if engine_dir is not None and not EngineDir(engine_dir).exists():
        out.append(
            f"{where}: parameter engine_dir={str(engine_dir)!r} is not an engine folder (no {RESOLVED_RECIPE})"
        )
    if "engine_overrides" in cfg.parameters:
        try:
            json.loads(cfg.parameters["engine_overrides"].string_value)
        except json.JSONDecodeError as exc:
            out.append(f"{where}: parameter engine_overrides is not JSON: {exc}")
    try:
        role_options({k: v.string_value for k, v in cfg.parameters.items()})
    except (BadInput, ValueError) as exc:
        out.append(f"{where}: {exc}")
    if not (model_dir / VERSION / "model.py").is_file():
        out.append(f"{model_dir / VERSION / 'model.py'}: missing (the python-backend model)")
    if cfg.model_warmup:
        out.append(
            f"{where}: model_warmup samples are not used by the llmkiln model (its engine host runs the warmup "
            "in initialize()): remove them and give the warmup as parameter 'warmup' (JSON)"
        )
    if "warmup" in cfg.parameters:
        try:
            Warmup.model_validate_json(cfg.parameters["warmup"].string_value)
        except ValueError as exc:
            out.append(f"{where}: parameter warmup is not a valid warmup section: {exc}")
    return out


def check_repository(repo: Path) -> list[CheckedModel]:
    """Parse every <repo>/<model>/config.pbtxt and validate it; BadInput listing every problem found."""
    repo = Path(repo)
    if not repo.is_dir():
        raise BadInput(f"{repo}: no such repository folder")
    model_dirs = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not model_dirs:
        raise BadInput(f"{repo}: no model folders; write one with `kiln repo ENGINE -o {repo}`")
    problems: list[str] = []
    models: list[CheckedModel] = []
    for model_dir in model_dirs:
        path = model_dir / "config.pbtxt"
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        cfg = mc.ModelConfig()
        try:
            text_format.Parse(path.read_text(), cfg)
        except text_format.ParseError as exc:
            problems.append(f"{path}: not a valid model config: {exc}")
            continue
        found = _problems(model_dir, cfg)
        problems.extend(found)
        if not found:
            models.append(CheckedModel(model_dir.name, cfg, Path(cfg.parameters["engine_dir"].string_value)))
    if problems:
        raise BadInput(f"{repo}: invalid Triton repository:\n  " + "\n  ".join(problems))
    return models
