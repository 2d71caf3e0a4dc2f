"""`kiln quality-diff CANDIDATE` and `kiln calibrate RECIPE`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from llmkiln.calibration.calibrate_run import calibrate_recipe
from llmkiln.calibration.quality_run import failure_message, run_quality_diff
from llmkiln.cli.options import engines_dir_option
from llmkiln.errors import BadInput, QualityBudgetExceeded


@click.command("quality-diff")
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option(
    "--reference",
    type=click.Path(path_type=Path),
    default=None,
    help="fp32 reference: an HF folder or an engine folder (default: the candidate's source model).",
)
@click.option(
    "--dataset",
    default=None,
    help="Held-out JSONL set (default: the recipe's quality_budget.dataset, else calibration/stories-eval.jsonl).",
)
@click.option("--budget-ppl-pct", type=float, default=None, help="Largest perplexity increase, in percent.")
@click.option("--budget-top1", type=float, default=None, help="Smallest top-1 agreement, e.g. 0.97.")
@click.option("--budget-kl", type=float, default=None, help="Largest mean per-token KL(ref||cand).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Report folder (default: CANDIDATE/quality).",
)
@click.option("--samples", type=int, default=None, help="Use only the first N evaluation texts.")
@click.option("--max-seq-len", type=int, default=256, show_default=True, help="Tokens scored per text.")
@click.option(
    "--continuation-tokens", type=int, default=32, show_default=True, help="Greedy tokens compared per text."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def quality_diff(
    candidate: Path,
    reference: Path | None,
    dataset: str | None,
    budget_ppl_pct: float | None,
    budget_top1: float | None,
    budget_kl: float | None,
    out_dir: Path | None,
    samples: int | None,
    max_seq_len: int,
    continuation_tokens: int,
    as_json: bool,
) -> None:
    """Compare CANDIDATE (engine folder or calibrated checkpoint) with an fp32 reference on held-out text.

    Exit 0 within budget, 1 outside it (the report names the worst examples), 2 on bad input.
    """
    for name, value in (("--samples", samples), ("--max-seq-len", max_seq_len),
                        ("--continuation-tokens", continuation_tokens)):  # fmt: skip
        if value is not None and value < 1:
            raise BadInput(f"{name} must be >= 1, got {value}")
    overrides = {
        "max_ppl_delta_pct": budget_ppl_pct,
        "min_top1_agreement": budget_top1,
        "max_mean_kl": budget_kl,
    }
    run = run_quality_diff(
        candidate, reference, dataset, out_dir, overrides, samples, max_seq_len, continuation_tokens,
        raise_on_failure=False,
    )  # fmt: skip
    res = run.result
    if as_json:
        click.echo(json.dumps({"passed": res.passed, "summary": res.summary, "violations": res.violations,
                               "report": {k: str(v) for k, v in run.report.items()}}, indent=2))  # fmt: skip
    else:
        s = res.summary
        click.echo(
            f"{res.candidate_kind} vs {res.reference_kind} on {Path(res.dataset).name} ({s['examples']} texts, "
            f"{s['tokens']} tokens)\n"
            f"  mean KL {s['mean_kl']:.3g}  max KL {s['max_kl']:.3g}  top-1 {s['top1_agreement']:.4f}\n"
            f"  ppl {s['ref_ppl']:.4f} -> {s['cand_ppl']:.4f} ({s['ppl_delta_pct']:+.3f}%)\n"
            f"  greedy exact match {s['greedy_exact_match']:.3f}  mean first divergence "
            f"{s['mean_first_divergence']:.2f}/{s['continuation_tokens']}\n"
            f"  report: {run.report['markdown']}"
        )
    if not res.passed:
        raise QualityBudgetExceeded(failure_message(res, run.report))


@click.command()
@click.argument("recipe")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Output folder (default: engines/.calibration/RECIPE).",
)
@click.option(
    "--engine",
    "engine_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="CPU recipes: take KV statistics from this engine folder (default: engines/RECIPE when built).",
)
@engines_dir_option
@click.option("--model", type=click.Path(path_type=Path), default=None, help="Use this HF folder instead.")
def calibrate(
    recipe: str, out_dir: Path | None, engine_dir: Path | None, engines_dir: Path, model: Path | None
) -> None:
    """Run RECIPE's calibration alone (ModelOpt FP8 for trtllm; KV scales for CPU int8/fp8 KV stores)."""
    summary = calibrate_recipe(recipe, out_dir, engine_dir, engines_dir, model)
    click.echo(json.dumps(summary, indent=2))
