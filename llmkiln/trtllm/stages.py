"""The trtllm backend's build stages (listed for backend "trtllm" in llmkiln.backends).

Order: trtllm-checkpoint (ModelOpt FP8 + FP8 KV calibration → TensorRT-LLM checkpoint, restored and validated;
cacheable) → trtllm-tokenizer (HF tokenizer files into tokenizer/) → triton-repo (the tensorrtllm model set,
warmup tokenized) → trtllm-engine (plan.json; trtllm-build when this is a GPU host).

On a host without CUDA or TensorRT-LLM the engine stage copies everything built so far into
engines/.pending/<recipe>/ (temp folder + rename), writes plan.json there and raises NeedsGpuHost (exit 3) naming
what is missing and the command to finish: `kiln build --resume engines/.pending/<recipe>/plan.json` on a GPU host
(llmkiln.trtllm.resume). The pipeline then drops its own temp folder, so engines/<recipe> is never half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from llmkiln.atomic import atomic_dir
from llmkiln.build.build_cache import build_key
from llmkiln.build.manifest import manifest_head
from llmkiln.build.stages import BuildContext
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput, NeedsGpuHost
from llmkiln.recipe import Recipe
from llmkiln.tokenizer_files import GENERATION_CONFIG, TOKENIZER_FILES, copy_tokenizer_files
from llmkiln.trtllm import pins
from llmkiln.trtllm import plan as plan_mod
from llmkiln.trtllm.calibrate import calibrate
from llmkiln.trtllm.checkpoint import finalize_checkpoint, validate_checkpoint
from llmkiln.trtllm.engine_build import gpu_status, run_trtllm_build, validate_engine
from llmkiln.trtllm.host import check_host
from llmkiln.trtllm.repo_check import check_trtllm_repository
from llmkiln.trtllm.repository import TrtllmRepoSpec, tokenize_warmup, write_trtllm_repository
from llmkiln.trtllm.rules import hf_config_of, raise_problems, recipe_and_model_problems
from llmkiln.trtllm.upstream import check_and_take, container_folder

TOKENIZER_DIR = "tokenizer"
# config.json too: AutoTokenizer in the pre/postprocessing models reads it
COPIED_SOURCE_FILES = (*TOKENIZER_FILES, GENERATION_CONFIG, "config.json")
PENDING_DIR = ".pending"
LLAMA_MODEL_TYPES = ("llama", "mistral")


def check_source(ctx: BuildContext) -> None:
    """Before anything is written: the recipe's fields (llmkiln.trtllm.rules), the model's head size and FP8
    alignment (from config.json, or a generated model's spec before it is generated), its family and context.
    Every problem found is reported at once (BadInput, exit 2)."""
    where, r = str(ctx.recipe_file), ctx.recipe
    cfg_path = ctx.source.path / "config.json"
    hf = json.loads(cfg_path.read_text()) if cfg_path.is_file() else None
    problems = recipe_and_model_problems(r, hf)
    shape = hf if hf is not None else hf_config_of(r, None)
    model_type = shape.get("model_type")
    if model_type not in LLAMA_MODEL_TYPES:
        problems.append(f"model: model_type {model_type!r}; the trtllm recipes build Llama-family models "
                        f"({', '.join(LLAMA_MODEL_TYPES)})")  # fmt: skip
    context = shape.get("max_position_embeddings")
    if context and r.limits.max_seq_len > context:
        problems.append(f"limits.max_seq_len ({r.limits.max_seq_len}) exceeds the model's max_position_embeddings "
                        f"({context}); lower it")  # fmt: skip
    raise_problems(r, where, problems)


def pending_dir(engines_root: Path, recipe_name: str) -> Path:
    return Path(engines_root) / PENDING_DIR / recipe_name


class TrtllmCheckpointStage:
    """ModelOpt FP8 + FP8-KV calibration and the validated TensorRT-LLM checkpoint (checkpoint/, calibration/)."""

    name = "trtllm-checkpoint"
    version = "1"
    cacheable = True

    def check(self, ctx: BuildContext) -> None:
        check_source(ctx)
        plan_mod.check_recipe(ctx.recipe, str(ctx.recipe_file))

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        r = ctx.recipe
        return {
            "source": ctx.source_hashes,
            "calibration": r.calibration.model_dump(mode="json"),
            "dtype": r.trtllm.dtype,
            "tp": r.trtllm.tp_size,
            "pp": r.trtllm.pp_size,
            "kv": r.kv_cache.dtype,
        }

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        r = ctx.recipe
        t0 = time.perf_counter()
        cal = calibrate(r, ctx.source.path, out_dir, ctx.recipe_file)
        ckpt = out_dir / plan_mod.CHECKPOINT_DIR
        if cal.trtllm_checkpoint_dir.resolve() != ckpt.resolve():
            shutil.move(str(cal.trtllm_checkpoint_dir), str(ckpt))
        calib_dir = out_dir / plan_mod.CALIBRATION_DIR
        calib_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.source.path / "config.json", calib_dir / "hf_config.json")
        summary = finalize_checkpoint(ckpt, ctx.source.path, dtype=r.trtllm.dtype, tp_size=r.trtllm.tp_size,
                                      pp_size=r.trtllm.pp_size)  # fmt: skip
        return {
            "checkpoint": summary.to_dict() | {"path": plan_mod.CHECKPOINT_DIR},
            "calibration": {
                "implementation": cal.implementation,
                "samples": r.calibration.samples,
                "max_seq_len": r.calibration.max_seq_len,
                "kv_scales_calibrated": cal.kv_scales.to_json(),
                "kv_scales_exported": summary.kv_cache_scales,
            },
            "seconds": round(time.perf_counter() - t0, 3),
        }


class TrtllmTokenizerStage:
    """Copy the source tokenizer (and config.json, for AutoTokenizer) into tokenizer/ for pre/postprocessing."""

    name = "trtllm-tokenizer"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {f: h for f, h in ctx.source_hashes.items() if f in COPIED_SOURCE_FILES}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        dst = out_dir / TOKENIZER_DIR
        dst.mkdir(parents=True, exist_ok=True)
        copied = copy_tokenizer_files(ctx.source.path, dst, COPIED_SOURCE_FILES)
        if not any(n in copied for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
            raise BadInput(
                f"{ctx.source.path}: no tokenizer files (tokenizer.json / tokenizer.model / vocab.json)"
            )
        return {"files": copied}


class TrtllmRepoStage:
    """The tensorrtllm Triton repository (triton_repo/), paths pointing at the published engine folder."""

    name = "triton-repo"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {"recipe": ctx.recipe.compute_hash(), "engine_dir": str(ctx.engine_dir)}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        # in the container (or with $LLMKILN_TRTLLM_MODELS) the python models' code is taken now; a CPU host has
        # none, and `kiln build --resume` takes it on the GPU host
        return render_repository(ctx.recipe, out_dir, ctx.engine_dir, container_folder("engine"))


def render_repository(recipe: Recipe, folder: Path, final_dir: Path, upstream: Path | None) -> dict[str, Any]:
    """(Re)write folder/triton_repo for an engine folder that will live at `final_dir` on the serving host,
    taking the python models' code from `upstream` (the container's inflight_batcher_llm folder) when given."""
    ids, end_id, pad_id = tokenize_warmup(recipe, folder / TOKENIZER_DIR)
    spec = TrtllmRepoSpec(
        recipe, final_dir / plan_mod.ENGINE_DIR, final_dir / TOKENIZER_DIR, ids, end_id, pad_id
    )
    repo = write_trtllm_repository(spec, folder / plan_mod.TRITON_REPO_DIR, overwrite=True)
    if upstream is not None:
        check_and_take(
            repo, upstream
        )  # the container's config.pbtxt must match first (BadInput naming the key)
    problems = check_trtllm_repository(repo)
    if problems:
        raise BadInput(f"{repo}: generated repository is invalid:\n  " + "\n  ".join(problems))
    return {
        "path": plan_mod.TRITON_REPO_DIR,
        "engine_dir": str(spec.engine_dir),
        "warmup_prompts": len(ids),
        "warmup_tokens": [len(x) for x in ids],
        "upstream_model_files": str(upstream) if upstream else None,
    }


class TrtllmEngineStage:
    """plan.json, then trtllm-build on a GPU host, or stop with exit 3 and a plan to resume elsewhere."""

    name = "trtllm-engine"
    version = "1"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {"argv": plan_mod.build_argv(ctx.recipe)}

    def describe(self, ctx: BuildContext) -> str:
        """The whole plan, for --dry-run (nothing is run)."""
        return plan_mod.render_plan(plan_mod.make_plan(ctx.recipe, recipe_file=ctx.recipe_file, done={}))

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        scratch = ctx.scratch.setdefault("trtllm", {})
        done = _done_steps(ctx, out_dir)
        status = gpu_status()
        pending = pending_dir(ctx.engines_root, ctx.recipe.name)
        publish_to = str(Path("..", "..", ctx.recipe.name)) if not status.ok else None
        plan = plan_mod.make_plan(
            ctx.recipe,
            recipe_file=ctx.recipe_file,
            done=done,
            manifest_draft=_manifest_draft(ctx),
            publish_to=publish_to,
        )
        if not status.ok:
            plan_mod.write_plan(out_dir / plan_mod.PLAN_NAME, plan)
            _stash(out_dir, pending, ctx.recipe)
            plan_path = pending / plan_mod.PLAN_NAME
            raise NeedsGpuHost(
                f"recipe {ctx.recipe.name}: built everything up to the TensorRT-LLM checkpoint and the Triton "
                f"repository, but trtllm-build needs a GPU host. Missing here: {'; '.join(status.missing)}. "
                f"Finish on a GPU host (container {pins.container()}, this checkout at the same path): "
                f"kiln build --resume {plan_path}"
            )
        host = check_host(ctx.recipe)  # versions and compute capability against the pins (exit 3 otherwise)
        argv = plan_mod.get_step(plan, "trtllm-build")["argv"]
        seconds = run_trtllm_build(argv, out_dir, out_dir / "trtllm-build.log")
        summary = validate_engine(out_dir / plan_mod.ENGINE_DIR, ctx.recipe)
        for s in plan["steps"]:
            s["status"] = "done"
        plan_mod.write_plan(out_dir / plan_mod.PLAN_NAME, plan)
        scratch["engine"] = summary
        return {"argv": argv, "build_seconds": round(seconds, 3), "engine": summary,
                "tensorrt_llm": host.tensorrt_llm, "tensorrt": host.tensorrt, "device": host.device}  # fmt: skip


def _done_steps(ctx: BuildContext, folder: Path) -> dict[str, dict[str, Any]]:
    """Results of the CPU steps, re-read from the folder (the cacheable checkpoint stage may not have run)."""
    hf_config = json.loads((folder / plan_mod.CALIBRATION_DIR / "hf_config.json").read_text())
    t = ctx.recipe.trtllm
    ckpt = validate_checkpoint(folder / plan_mod.CHECKPOINT_DIR, hf_config, dtype=t.dtype, tp_size=t.tp_size,
                               pp_size=t.pp_size)  # fmt: skip
    meta_path = folder / plan_mod.CALIBRATION_DIR / "calibration.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    calib = {
        k: meta.get(k) for k in ("samples", "tokens", "max_seq_len", "algorithm", "quant_cfg") if k in meta
    }
    ckpt_part = ckpt.to_dict() | {"path": plan_mod.CHECKPOINT_DIR}
    return {
        "hash-weights": {"files": len(ctx.source_hashes)},
        "calibrate": calib
        | {"outputs": sorted(p.name for p in (folder / plan_mod.CALIBRATION_DIR).iterdir())},
        "checkpoint": ckpt_part,
        "triton-repo": {"path": plan_mod.TRITON_REPO_DIR},
    }


def _manifest_draft(ctx: BuildContext) -> dict[str, Any]:
    """What the pipeline would put in manifest.json, for a resume on another host to complete."""
    key = build_key(ctx.recipe, ctx.source_hashes, ctx.tool_versions, ctx.stages, ctx)
    return manifest_head(ctx, key)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _stash(work_dir: Path, pending: Path, recipe: Recipe) -> None:
    """Put the assembled folder at engines/.pending/<recipe> (hard links, temp + rename; replaces an older one)."""
    with atomic_dir(pending) as tmp:
        shutil.copytree(work_dir, tmp, dirs_exist_ok=True, copy_function=_link_or_copy)
        EngineDir(tmp).write_recipe(recipe)
