"""Build stages of the calibration room.

`CpuCalibrationStage` (backends onnx-cpu/onnx-gpu/openvino-cpu, after the export and tokenizer stages), for
quantized recipes (precision int8/int4 — or bf16 on openvino-cpu — or an int8/fp8 KV block store on onnx-*):
  1. KV scales: per-layer, per-KV-head absmax of the engine's own cached K/V (present.* outputs of one prefill per
     calibration text) → calibration/kv_scales.json (only when kv_cache.dtype is int8 or fp8).
  2. Quality gate: the quality diff of the engine being assembled against the fp32 HF source on the held-out set
     → calibration/quality/ (JSON, Markdown, PNG). Outside quality_budget → QualityBudgetExceeded (exit 1), the
     engine is not published (the report is kept in engines/.quality/<recipe>/), unless
     --allow-quality-regression, which publishes it and records the regression in the manifest.
`FakeQuantQualityStage` (backend trtllm, after the ModelOpt checkpoint stage): the same gate on the ModelOpt
fake-quant model that calibrate_fp8 saved.

Both stages add `build_key_extra(ctx)` (calibration settings, budget and the sha256 of every data set they read) so
that editing a calibration set rebuilds the engine; the scales themselves are listed in the manifest with sha256.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from llmkiln.build.stages import BuildContext
from llmkiln.calibration.candidates import (
    FakeQuantScorer,
    HfScorer,
    OnnxScorer,
    OpenVinoScorer,
    Scorer,
    is_fake_quant,
)
from llmkiln.calibration.datasets import calib_dataset, check_no_overlap, eval_dataset, load_jsonl, texts
from llmkiln.calibration.kv_effect import kv_store_effect
from llmkiln.calibration.kv_stats import KvAbsmax
from llmkiln.calibration.quality_diff import Budget, QualityResult, quality_diff
from llmkiln.calibration.quality_report import write_report
from llmkiln.calibration.quality_run import failure_message
from llmkiln.capabilities import Backend
from llmkiln.engine_dir import CALIBRATION_DIR, KV_SCALES
from llmkiln.errors import BadInput, QualityBudgetExceeded
from llmkiln.hashing import sha256_file
from llmkiln.kv_scales import KvScales
from llmkiln.recipe import Recipe

QUANTIZED_KV = ("int8", "fp8")
STAGE_VERSION = "1"


def needs_kv_scales(recipe: Recipe) -> bool:
    return recipe.kv_cache.dtype in QUANTIZED_KV


def is_quantized(recipe: Recipe) -> bool:
    """Anything but fp32 arithmetic on the checkpoint's weights: the quality gate runs."""
    return recipe.precision != "fp32" or recipe.weights != "checkpoint"


def engine_kv_scales(engine_dir: Path, recipe: Recipe, source_dir: Path | None = None) -> KvScales:
    """KV scales from the engine's own cached K/V over the recipe's calibration set."""
    scorer = OnnxScorer(engine_dir)
    info = scorer.gen.info
    algorithm = "max" if recipe.calibration.algorithm == "builder" else recipe.calibration.algorithm
    stats = KvAbsmax(info.num_layers, info.kv_heads, algorithm=algorithm)
    path = calib_dataset(recipe)
    max_len = min(recipe.calibration.max_seq_len, recipe.limits.max_seq_len)
    for text in texts(load_jsonl(path), limit=recipe.calibration.samples):
        ids = scorer.encode(text)[:max_len]
        for i, (k, v) in enumerate(scorer.present_kv(ids)):
            stats.update(i, k, v)
    return stats.to_scales(
        recipe.kv_cache.dtype,
        source="onnx engine present.* (post-rotary K), one prefill per calibration text",
        dataset=str(path),
        max_seq_len=max_len,
    )


def _dataset_keys(recipe: Recipe) -> dict[str, str]:
    out = {}
    for getter in (calib_dataset, eval_dataset):
        try:
            p = getter(recipe)
        except BadInput:
            continue
        out[p.name] = sha256_file(p)
    return out


def _gate(ctx: BuildContext, res: QualityResult, report_dir: Path) -> dict[str, Any]:
    """Manifest part for the quality result; raises QualityBudgetExceeded unless regressions are allowed."""
    allowed = ctx.options.allow_quality_regression
    if not res.passed and not allowed:
        keep = ctx.engines_root / ".quality" / ctx.recipe.name
        if keep.exists():
            shutil.rmtree(keep)
        shutil.copytree(report_dir, keep)
        report = {"markdown": keep / "quality_report.md"}
        raise QualityBudgetExceeded(
            failure_message(res, report) + ". The engine was not published; rebuild with "
            "--allow-quality-regression to publish it anyway, or relax quality_budget in the recipe."
        )
    return {
        "passed": res.passed,
        "regression_allowed": (not res.passed) and allowed,
        "violations": res.violations,
        "summary": res.summary,
        "budget": res.to_json()["budget"],
        "dataset": Path(res.dataset).name,
        "worst_examples": [e.id for e in res.worst],
        "report": f"{report_dir.relative_to(ctx.require_work_dir())}/quality_report.md",
        "seconds": round(res.seconds, 3),
    }


class _Common:
    version = STAGE_VERSION
    cacheable = False

    def check(self, ctx: BuildContext) -> None:
        r = ctx.recipe
        if not self.applies(r):
            return
        calib = load_jsonl(calib_dataset(r))
        evals = load_jsonl(eval_dataset(r))
        check_no_overlap(calib, evals, f"{ctx.recipe_file}: calibration.dataset vs the evaluation set")

    def applies(self, recipe: Recipe) -> bool:
        raise NotImplementedError

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        r = ctx.recipe
        if not self.applies(r):
            return {"applies": False}
        return {
            "applies": True,
            "calibration": r.calibration.model_dump(mode="json"),
            "quality_budget": r.quality_budget.model_dump(mode="json"),
            "kv_dtype": r.kv_cache.dtype,
            "datasets": _dataset_keys(r),
        }

    def build_key_extra(self, ctx: BuildContext) -> dict[str, Any]:
        """Inputs not in the recipe hash (data set contents) that the whole-build key must include."""
        return self.cache_key(ctx)


class CpuCalibrationStage(_Common):
    """KV scales + quality gate for quantized ONNX engines (see the module docstring)."""

    name = "calibration"

    def applies(self, recipe: Recipe) -> bool:
        return is_quantized(recipe) or needs_kv_scales(recipe)

    def check(self, ctx: BuildContext) -> None:
        # the quality gate runs the engine here: a precision this CPU cannot run is refused before anything is
        # exported (CpuLacksFeature, exit 2, naming what to use instead)
        if ctx.recipe.backend is Backend.OPENVINO_CPU:
            from llmkiln.runtime.openvino_runner import require_precision  # imports openvino

            require_precision(ctx.recipe.precision)

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        r = ctx.recipe
        if not self.applies(r):
            return {"skipped": "fp32 weights and an unquantized KV store: nothing to calibrate"}
        t0 = time.perf_counter()
        calib = out_dir / CALIBRATION_DIR
        calib.mkdir(exist_ok=True)
        part: dict[str, Any] = {"dataset": calib_dataset(r).name, "datasets_sha256": _dataset_keys(r)}
        if needs_kv_scales(r):
            scales = engine_kv_scales(out_dir, r)
            path = scales.write(out_dir / KV_SCALES)
            part["kv_scales"] = {
                "path": KV_SCALES,
                "sha256": sha256_file(path),
                "dtype": scales.dtype,
                "sequences": scales.provenance.get("sequences"),
                "tokens": scales.provenance.get("tokens"),
                "algorithm": scales.provenance.get("algorithm"),
            }
            part["kv_store_effect"] = kv_store_effect(
                OnnxScorer(out_dir),
                scales,
                load_jsonl(eval_dataset(r)),
                tokens_per_block=r.kv_cache.tokens_per_block,
                max_seq_len=min(256, r.limits.max_seq_len),
            )
        if is_quantized(r):
            candidate: Scorer = (
                OpenVinoScorer(out_dir, r.precision, max_len=r.limits.max_seq_len)
                if r.backend is Backend.OPENVINO_CPU
                else OnnxScorer(out_dir)
            )
            res = quality_diff(
                candidate,
                HfScorer(ctx.source.path),
                load_jsonl(eval_dataset(r)),
                dataset=str(eval_dataset(r)),
                budget=Budget.from_recipe(r.quality_budget),
                max_seq_len=min(256, r.limits.max_seq_len),
                continuation_tokens=r.quality_budget.continuation_tokens,
                samples=r.quality_budget.samples,
            )
            res.candidate = str(ctx.engine_dir)  # not the temp folder it is assembled in
            report_dir = calib / "quality"
            write_report(res, report_dir)
            part["quality"] = _gate(ctx, res, report_dir)
        part["seconds"] = round(time.perf_counter() - t0, 3)
        return part


class FakeQuantQualityStage(_Common):
    """Quality gate of the ModelOpt fake-quant model written by the trtllm checkpoint stage."""

    name = "quality"

    def applies(self, recipe: Recipe) -> bool:
        return True  # every trtllm recipe is FP8

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        found = [d for d in (out_dir, out_dir / CALIBRATION_DIR, *out_dir.glob("*/")) if is_fake_quant(d)]
        if not found:
            return {"skipped": "no calibrate_fp8 output (calibration.json + modelopt_state.pth) in the build"}
        r = ctx.recipe
        res = quality_diff(
            FakeQuantScorer(found[0], ctx.source.path),
            HfScorer(ctx.source.path),
            load_jsonl(eval_dataset(r)),
            dataset=str(eval_dataset(r)),
            budget=Budget.from_recipe(r.quality_budget),
            max_seq_len=min(256, r.limits.max_seq_len),
            continuation_tokens=min(16, r.quality_budget.continuation_tokens),
            samples=r.quality_budget.samples or 8,  # the fake-quant model is slow on CPU
        )
        res.candidate = f"{ctx.engine_dir} (ModelOpt fake-quant of {found[0].name})"
        report_dir = out_dir / CALIBRATION_DIR / "quality"
        write_report(res, report_dir)
        return {"calibration_dir": str(found[0].relative_to(out_dir)), **_gate(ctx, res, report_dir)}
