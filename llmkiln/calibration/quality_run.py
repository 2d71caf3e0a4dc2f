"""`kiln quality-diff` as a library call: resolve candidate, reference, dataset and budget; run; write the report.

Defaults, in order: the reference is the candidate's fp32 source (engine manifest `source.path`, or the
calibration's `source`); the dataset is the recipe's `quality_budget.dataset`, else the `-eval` twin of
`calibration.dataset`, else calibration/stories-eval.jsonl; the budget is the engine recipe's `quality_budget`
with any CLI limit overriding it. Raises QualityBudgetExceeded (exit 1) after writing the report when the
candidate is outside the budget, BadInput (exit 2) on bad paths or files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmkiln.calibration.candidates import default_reference, open_scorer
from llmkiln.calibration.datasets import eval_dataset, load_jsonl, resolve_dataset
from llmkiln.calibration.quality_diff import Budget, QualityResult, quality_diff
from llmkiln.calibration.quality_report import write_report
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import QualityBudgetExceeded


@dataclass
class QualityRun:
    """A finished quality diff and where its report went."""

    result: QualityResult
    report: dict[str, Path]


def failure_message(res: QualityResult, report: dict[str, Path] | None) -> str:
    worst = ", ".join(f"{e.id} (mean KL {e.mean_kl:.3g})" for e in res.worst[:3])
    where = f"; report: {report['markdown']}" if report else ""
    return (
        f"{res.candidate} is outside its quality budget: "
        + "; ".join(res.violations)
        + f". Worst examples: {worst}{where}"
    )


def run_quality_diff(
    candidate: str | Path,
    reference: str | Path | None = None,
    dataset: str | Path | None = None,
    out_dir: str | Path | None = None,
    budget_overrides: dict[str, float | None] | None = None,
    samples: int | None = None,
    max_seq_len: int = 256,
    continuation_tokens: int = 32,
    raise_on_failure: bool = True,
) -> QualityRun:
    """Run the diff, write JSON/Markdown/PNG into out_dir (default CANDIDATE/quality), check the budget."""
    cand_path = Path(candidate).resolve()
    cand = open_scorer(cand_path)
    folder = EngineDir(cand_path)
    recipe = folder.recipe() if folder.exists() else None
    ref = open_scorer(Path(reference) if reference else default_reference(cand_path))
    ds_path = resolve_dataset(dataset) if dataset else eval_dataset(recipe)
    budget = (Budget.from_recipe(recipe.quality_budget) if recipe else Budget()).merged(
        **(budget_overrides or {})
    )
    if recipe is not None:
        max_seq_len = min(max_seq_len, recipe.limits.max_seq_len)
    result = quality_diff(
        cand,
        ref,
        load_jsonl(ds_path),
        dataset=str(ds_path),
        budget=budget,
        max_seq_len=max_seq_len,
        continuation_tokens=continuation_tokens,
        samples=samples,
    )
    report = write_report(result, Path(out_dir) if out_dir else cand_path / "quality")
    if raise_on_failure and not result.passed:
        raise QualityBudgetExceeded(failure_message(result, report))
    return QualityRun(result, report)
