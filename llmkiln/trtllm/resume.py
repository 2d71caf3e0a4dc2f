"""`kiln build --resume PLAN`: finish a trtllm build on a GPU host from the plan folder the CPU host left.

Steps (plan.json lists them): check the host against the pins and the recipe (tensorrt_llm.__version__,
tensorrt.__version__, the GPU's compute capability; else NeedsGpuHost, exit 3, naming what was found and what is
needed), compare the generated config.pbtxt files with the container's model files (/app/all_models/
inflight_batcher_llm or $LLMKILN_TRTLLM_MODELS; a mismatch is bad input naming the key), re-validate the
checkpoint, run the recorded trtllm-build argv in the plan folder, check engine/config.json + rank*.engine,
re-render the Triton repository with the final paths and the container's python model code, write manifest.json (the CPU host's draft + the engine part
+ hashes of every file), mark every step done, and rename the folder into place (plan "publish" step:
engines/<recipe>). A failure leaves the plan folder as it was (a partial engine/ is removed).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmkiln.atomic import replace_dir
from llmkiln.build.manifest import hash_engine_files
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe, validate
from llmkiln.trtllm import plan as plan_mod
from llmkiln.trtllm.checkpoint import validate_checkpoint
from llmkiln.trtllm.engine_build import run_trtllm_build, validate_engine
from llmkiln.trtllm.host import HostFacts
from llmkiln.trtllm.host import check_host as check_host_fits
from llmkiln.trtllm.stages import render_repository
from llmkiln.trtllm.upstream import default_upstream, require_match
from llmkiln.versions import tool_versions


@dataclass
class ResumeResult:
    """Where the finished engine folder is, and its manifest."""

    engine_dir: Path
    manifest: dict[str, Any]
    seconds: float


def final_dir_for(plan_dir: Path, plan: dict[str, Any]) -> Path:
    to = plan_mod.get_step(plan, "publish").get("to")
    if not to:
        raise BadInput(f"{plan_dir}: plan step 'publish' has no destination")
    return (plan_dir / to).resolve()


def resume_build(plan_path: Path, *, check_host: bool = True) -> ResumeResult:
    """Finish the build described by plan_path (a plan.json or its folder). See the module docstring."""
    t0 = time.perf_counter()
    plan_path = Path(plan_path)
    plan = plan_mod.read_plan(plan_path)
    plan_dir = (plan_path if plan_path.is_dir() else plan_path.parent).resolve()
    recipe: Recipe = validate(plan["resolved_recipe"], f"{plan_path}: resolved_recipe")
    host = check_host_fits(recipe) if check_host else None
    final = final_dir_for(plan_dir, plan)
    upstream = default_upstream("engine")
    require_match(plan_dir / plan_mod.TRITON_REPO_DIR, upstream)  # before the long build: fail fast
    hf_config = json.loads((plan_dir / plan_mod.CALIBRATION_DIR / "hf_config.json").read_text())
    validate_checkpoint(plan_dir / plan_mod.CHECKPOINT_DIR, hf_config, dtype=recipe.trtllm.dtype,
                        tp_size=recipe.trtllm.tp_size, pp_size=recipe.trtllm.pp_size)  # fmt: skip
    argv = plan_mod.get_step(plan, "trtllm-build")["argv"]
    try:
        seconds = run_trtllm_build(argv, plan_dir, plan_dir / "trtllm-build.log")
        engine = validate_engine(plan_dir / plan_mod.ENGINE_DIR, recipe)
    except BaseException:
        shutil.rmtree(plan_dir / plan_mod.ENGINE_DIR, ignore_errors=True)
        raise
    repo = render_repository(recipe, plan_dir, final, upstream)
    for s in plan["steps"]:
        s["status"] = "done"
    plan["resumed_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    plan_mod.write_plan(plan_dir / plan_mod.PLAN_NAME, plan)
    manifest = write_manifest(plan_dir, plan, engine, repo, argv, seconds, host, time.perf_counter() - t0)
    final.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(plan_dir, final)  # the finished plan folder becomes the engine, replacing an older one
    return ResumeResult(final, manifest, time.perf_counter() - t0)


def write_manifest(
    folder: Path,
    plan: dict[str, Any],
    engine: dict[str, Any],
    repo: dict[str, Any],
    argv: list[str],
    build_seconds: float,
    host: HostFacts | None,
    seconds: float,
) -> dict[str, Any]:
    manifest = dict(plan.get("manifest_draft") or {})
    manifest.update(
        {
            "trtllm-engine": {
                "argv": argv,
                "build_seconds": round(build_seconds, 3),
                "engine": engine,
                "tensorrt_llm": host.tensorrt_llm if host else None,
                "tensorrt": host.tensorrt if host else None,
                "compute_capability": ".".join(map(str, host.compute_capability or ())) if host else None,
                "device": host.device if host else None,
                "resumed_on_tool_versions": tool_versions(),
            },
            "triton-repo": repo,
            "engine_files": hash_engine_files(folder),
            "build_seconds": round(seconds, 3),
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "resumed_from_plan": plan_mod.PLAN_NAME,
        }
    )
    return EngineDir(folder).write_manifest(manifest).to_json()
