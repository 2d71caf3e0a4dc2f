"""The trtllm-llmapi backend's build stages (listed in llmkiln.backends): everything runs on a CPU host, and
`kiln build` ends with exit 0 and a complete engine folder.

Order: llmapi-checkpoint (ModelOpt FP8 + FP8 KV calibration → the unified HF checkpoint TensorRT-LLM's PyTorch
backend loads, config normalized for the container's transformers, validated, sha256 of every file; cacheable)
→ quality gate → llmapi-options (llm_api_options.yaml, every key checked against the pinned LlmArgs facts) →
llmapi-repo (Triton `llmapi` model: config.pbtxt, model.yaml, warmup, deploy.json + DEPLOY.md with the exact
docker / tritonserver / trtllm-serve lines).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from llmkiln.build.stages import BuildContext
from llmkiln.engine_dir import DEPLOY_MD, HF_CHECKPOINT_DIR, EngineDir
from llmkiln.recipe import Recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.calibrate import calibrate
from llmkiln.trtllm.deploy import commands, deploy_markdown
from llmkiln.trtllm.facts import FACTS_FILES, check_options, facts
from llmkiln.trtllm.hf_checkpoint import normalize_checkpoint, validate_hf_checkpoint
from llmkiln.trtllm.llmapi import llm_api_options
from llmkiln.trtllm.llmapi_repo import LlmapiRepoSpec, write_llmapi_repository
from llmkiln.trtllm.repository import tokenize_warmup
from llmkiln.trtllm.stages import check_source

CALIBRATION_DIR = "calibration"
TRITON_REPO_DIR = "triton_repo"


class LlmapiCheckpointStage:
    """ModelOpt FP8 + FP8-KV calibration → hf_checkpoint/ (and calibration/ with the KV scales and logs)."""

    name = "llmapi-checkpoint"
    version = "1"
    cacheable = True

    def check(self, ctx: BuildContext) -> None:
        check_source(ctx)

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        r = ctx.recipe
        return {"source": ctx.source_hashes, "calibration": r.calibration.model_dump(mode="json"),
                "kv": r.kv_cache.dtype, "tp": r.trtllm.tp_size, "pp": r.trtllm.pp_size}  # fmt: skip

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        r = ctx.recipe
        cal = calibrate(r, ctx.source.path, out_dir, ctx.recipe_file)
        calib_dir = out_dir / CALIBRATION_DIR
        if cal.hf_checkpoint_dir is None:
            raise RuntimeError("calibrate_fp8 always exports the HF checkpoint")
        ckpt = out_dir / HF_CHECKPOINT_DIR
        shutil.move(str(cal.hf_checkpoint_dir), str(ckpt))
        # The TensorRT-LLM (engine) checkpoint is the other backend's input: not part of this engine folder.
        shutil.rmtree(cal.trtllm_checkpoint_dir, ignore_errors=True)
        shutil.copyfile(ctx.source.path / "config.json", calib_dir / "hf_config.json")
        normalized = normalize_checkpoint(ckpt)
        summary = validate_hf_checkpoint(ckpt)
        return {
            "checkpoint": summary | {"path": HF_CHECKPOINT_DIR, "config_normalized": normalized},
            "calibration": {"implementation": cal.implementation, "samples": r.calibration.samples,
                            "max_seq_len": r.calibration.max_seq_len, "kv_scales": cal.kv_scales.to_json()},
            "seconds": round(time.perf_counter() - t0, 3),
        }  # fmt: skip


class LlmapiOptionsStage:
    """llm_api_options.yaml: the recipe as LLM(**kwargs), each key known to the pinned TensorRT-LLM."""

    name = "llmapi-options"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {"recipe": ctx.recipe.compute_hash()}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        options = llm_api_options(ctx.recipe)
        check_options(options, "llm_api_options.yaml")
        header = (f"# LLM(**kwargs) for TensorRT-LLM {pins.pin('tensorrt_llm')} (PyTorch backend) in "
                  f"{pins.container()}, from recipe {ctx.recipe.name}\n"
                  "# (trtllm-serve --extra_llm_api_options, the llmapi model.yaml; Dynamo's dynamo.trtllm runs another "
                  "TensorRT-LLM: `kiln deploy dynamo` writes its own llm_api.yaml)\n")  # fmt: skip
        EngineDir(out_dir).write_llm_api_options(options, header)
        return {
            "options": options,
            "checked_against": f"{FACTS_FILES['triton'].name} (TensorRT-LLM {facts()['tensorrt_llm']})",
        }


class LlmapiRepoStage:
    """The Triton llmapi repository (paths pointing at the published folder), warmup, deploy commands."""

    name = "llmapi-repo"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {"recipe": ctx.recipe.compute_hash(), "engine_dir": str(ctx.engine_dir)}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        return render_llmapi(ctx.recipe, out_dir, ctx.engine_dir)


def render_llmapi(recipe: Recipe, folder: Path, final_dir: Path) -> dict[str, Any]:
    """triton_repo/, deploy.json and DEPLOY.md in `folder` for an engine folder that will live at `final_dir`."""
    ids, _, _ = tokenize_warmup(
        recipe, folder / HF_CHECKPOINT_DIR
    )  # the warmup rule, with the model's tokenizer
    spec = LlmapiRepoSpec(recipe, final_dir / HF_CHECKPOINT_DIR)
    write_llmapi_repository(spec, folder / TRITON_REPO_DIR)
    cmds = commands(recipe, final_dir)
    EngineDir(folder).write_deploy_commands(cmds)
    (folder / DEPLOY_MD).write_text(deploy_markdown(recipe, cmds))
    return {
        "path": TRITON_REPO_DIR,
        "checkpoint": str(spec.checkpoint_dir),
        "warmup_requests": len(ids) * recipe.warmup.count,
        "warmup_tokens": [len(x) for x in ids],
        "deploy": json.loads(json.dumps(cmds)),
    }
