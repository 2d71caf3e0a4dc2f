"""The TensorRT-LLM build plan: the exact trtllm-build argv from the recipe, and the plan file (JSON).

The plan file lives in the staging folder of a trtllm build (engines/.pending/<recipe>/plan.json when the host
has no GPU) next to everything the CPU stages produced. Every path in it is relative to that folder, so the folder
can be copied to a GPU host as it is and finished there with `kiln build --resume PLAN`. It lists every step with
its status (done / pending), where it must run (cpu / gpu), and for trtllm-build the exact argv, run with the plan
folder as working directory. The argv is checked against the flag list of the pinned TensorRT-LLM (flags.py)
when it is made and again when a plan is read.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmkiln.atomic import write_text_atomic
from llmkiln.capabilities import Backend
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.flags import check_build_rules, parse_argv

PLAN_FORMAT = "llmkiln.trtllm-plan"
PLAN_VERSION = 1
PLAN_NAME = "plan.json"
CHECKPOINT_DIR = "checkpoint"
ENGINE_DIR = "engine"
CALIBRATION_DIR = "calibration"
TRITON_REPO_DIR = "triton_repo"
TIMING_CACHE = "timing.cache"

STEP_ORDER = (
    "hash-weights",
    "calibrate",
    "checkpoint",
    "triton-repo",
    "trtllm-build",
    "engine-manifest",
    "publish",
)


def _onoff(flag: bool) -> str:
    return "enable" if flag else "disable"


def check_recipe(recipe: Recipe, where: str) -> None:
    """trtllm-build / tensorrtllm-backend combinations TensorRT-LLM would reject or silently ignore (BadInput
    naming the fields); the recipe-wide rules are llmkiln.trtllm.rules."""
    t = recipe.trtllm
    if recipe.backend is not Backend.TRTLLM:
        raise BadInput(
            f"{where}: field 'backend' is {recipe.backend!r}; the TensorRT-LLM plan needs backend: trtllm"
        )
    chunked = recipe.scheduler.chunked_prefill
    if (recipe.kv_cache.prefix_reuse or chunked) and not t.use_paged_context_fmha:
        raise BadInput(
            f"{where}: field 'trtllm.use_paged_context_fmha' is false, but kv_cache.prefix_reuse / "
            "scheduler.chunked_prefill need it (TensorRT-LLM: paged context FMHA enables KV reuse and chunking)"
        )
    if recipe.scheduler.batching == "static" and (recipe.kv_cache.prefix_reuse or chunked):
        raise BadInput(
            f"{where}: field 'scheduler.batching' static (gpt_model_type V1) supports neither KV reuse "
            "(kv_cache.prefix_reuse) nor chunked context (scheduler.chunked_prefill)"
        )


def build_argv(recipe: Recipe) -> list[str]:
    """The exact trtllm-build argv for the recipe (paths relative to the plan folder).

    No --max_input_len: trtllm-build ignores it when remove_input_padding and context FMHA are on (in-flight
    batching needs both), so prompts are bounded by --max_seq_len; llmkiln.trtllm.rules rejects a recipe that
    sets limits.max_input_len for this backend instead of passing a flag that does nothing."""
    t = recipe.trtllm
    argv = [
        "trtllm-build",
        "--checkpoint_dir", CHECKPOINT_DIR,
        "--output_dir", ENGINE_DIR,
        "--max_batch_size", str(recipe.scheduler.max_batch_size),
        "--max_seq_len", str(recipe.limits.max_seq_len),
        "--max_num_tokens", str(recipe.scheduler.max_num_tokens),
        "--max_beam_width", str(t.max_beam_width),
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(recipe.kv_cache.tokens_per_block),
        "--gpt_attention_plugin", t.gpt_attention_plugin,
        "--gemm_plugin", t.gemm_plugin,
        "--context_fmha", "enable",
        "--remove_input_padding", "enable",
        "--use_paged_context_fmha", _onoff(t.use_paged_context_fmha),
        "--use_fp8_context_fmha", _onoff(t.use_fp8_context_fmha),
        "--multiple_profiles", _onoff(t.multiple_profiles),
        "--use_fused_mlp", _onoff(t.use_fused_mlp),
        "--workers", str(t.workers),
        "--output_timing_cache", TIMING_CACHE,
    ]  # fmt: skip
    validate_argv(argv)
    return argv


def validate_argv(argv: list[str], where: str = "trtllm-build argv") -> dict[str, str | bool]:
    """Every flag known (the pinned TensorRT-LLM 1.2.1), every value valid, the builder's cross-flag rules hold."""
    flags = parse_argv(argv, where)
    check_build_rules(flags, where)
    for key in ("--checkpoint_dir", "--output_dir", "--output_timing_cache", "--input_timing_cache"):
        value = flags.get(key)
        if isinstance(value, str) and (os.path.isabs(value) or ".." in Path(value).parts):
            raise BadInput(f"{where}: {key} {value!r} must be a path inside the plan folder")
    return flags


def step(name: str, where: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "where": where, "status": status, **extra}


def make_plan(
    recipe: Recipe,
    *,
    recipe_file: Path,
    done: dict[str, dict[str, Any]],
    manifest_draft: dict[str, Any] | None = None,
    publish_to: str | None = None,
) -> dict[str, Any]:
    """The plan document. `done` maps finished step names to their results; the rest are pending."""
    argv = build_argv(recipe)
    gpus = recipe.trtllm.tp_size * recipe.trtllm.pp_size
    specs: dict[str, tuple[str, dict[str, Any]]] = {
        "hash-weights": ("cpu", {"what": "sha256 of every source weight file"}),
        "calibrate": ("cpu", {"what": "ModelOpt FP8 weights + FP8 KV calibration", "outputs": [CALIBRATION_DIR]}),
        "checkpoint": ("cpu", {"what": "TensorRT-LLM checkpoint, rotary_base restored, validated",
                               "outputs": [CHECKPOINT_DIR]}),
        "triton-repo": ("cpu", {"what": "tensorrtllm model set (re-rendered on resume with the final paths)",
                                "outputs": [TRITON_REPO_DIR], "rerun_on_resume": True}),
        "trtllm-build": ("gpu", {"argv": argv, "cwd": ".", "gpus": gpus,
                                 "outputs": [ENGINE_DIR, TIMING_CACHE]}),
        "engine-manifest": ("gpu", {"what": "check engine/config.json + rank*.engine, write manifest.json",
                                    "expect": [f"{ENGINE_DIR}/config.json"]
                                    + [f"{ENGINE_DIR}/rank{r}.engine" for r in range(gpus)]}),
        "publish": ("cpu", {"what": "rename the finished folder into engines/<recipe>", "to": publish_to}),
    }  # fmt: skip
    steps = []
    for name in STEP_ORDER:
        where, extra = specs[name]
        if name in done:
            steps.append(step(name, where, "done", **extra, result=done[name]))
        else:
            steps.append(step(name, where, "pending", **extra))
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "recipe": recipe.name,
        "recipe_file": str(recipe_file),
        "recipe_sha256": recipe.compute_hash(),
        "resolved_recipe": recipe.model_dump(mode="json"),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "created_on": socket.gethostname(),
        "pins": pins.pins(),
        "requires": {
            "cuda": "torch.cuda.is_available()",
            "tensorrt_llm": "import tensorrt_llm",
            "gpus": gpus,
        },
        "steps": steps,
        "manifest_draft": manifest_draft or {},
    }


def get_step(plan: dict[str, Any], name: str) -> dict[str, Any]:
    for s in plan["steps"]:
        if s["name"] == name:
            return s
    raise BadInput(f"plan has no step {name!r}")


def write_plan(path: Path, plan: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(plan, indent=2) + "\n")


def read_plan(path: Path) -> dict[str, Any]:
    """Load and check a plan file; BadInput naming the file and what is wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / PLAN_NAME
    if not path.is_file():
        raise BadInput(
            f"{path}: no such plan file (kiln build writes it as engines/.pending/<recipe>/{PLAN_NAME})"
        )
    try:
        plan = json.loads(path.read_text())
    except ValueError as exc:
        raise BadInput(f"{path}: not JSON ({exc})") from exc
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise BadInput(f"{path}: not an llmkiln TensorRT-LLM plan (format {plan.get('format')!r})")
    if plan.get("version") != PLAN_VERSION:
        raise BadInput(
            f"{path}: plan version {plan.get('version')!r}; this llmkiln reads version {PLAN_VERSION}"
        )
    names = [s.get("name") for s in plan.get("steps", [])]
    if tuple(names) != STEP_ORDER:
        raise BadInput(f"{path}: steps {names}; expected {list(STEP_ORDER)}")
    validate_argv(get_step(plan, "trtllm-build")["argv"], where=f"{path}: step trtllm-build argv")
    return plan


def render_plan(plan: dict[str, Any]) -> str:
    """Human-readable plan (kiln build --dry-run)."""
    lines = [f"TensorRT-LLM plan for recipe {plan['recipe']} (pins: TensorRT-LLM {plan['pins']['tensorrt_llm']}, "
             f"{plan['pins']['container']})"]  # fmt: skip
    for i, s in enumerate(plan["steps"], 1):
        lines.append(f"  {i}. [{s['status']:>7}] {s['name']:<16} ({s['where']}) {s.get('what', '')}".rstrip())
        if "argv" in s:
            lines.append(f"       cd <plan folder> && {' '.join(s['argv'])}")
    return "\n".join(lines)
