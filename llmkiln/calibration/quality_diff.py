"""Quality diff: a candidate (quantized engine or fake-quant checkpoint) against an fp32 reference on held-out text.

For every evaluation text both models score the same token ids with one forward (all positions' logits). Metrics:
per-token KL(ref‖cand) over the full vocabulary (mean and max), top-1 agreement, perplexity of each on the text's
own next tokens and the relative delta, and greedy continuation from the record's prompt (or the first half of
its tokens): exact-match rate over `continuation_tokens` tokens and the mean first-divergence position. The worst
examples (highest mean KL) are listed with the place their KL peaks. `check_budget` compares against a `Budget`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llmkiln.calibration.candidates import Scorer
from llmkiln.calibration.datasets import TextRecord
from llmkiln.errors import BadInput
from llmkiln.recipe import QualityBudget


@dataclass
class Budget:
    """Limits a candidate must meet; None = not checked."""

    max_ppl_delta_pct: float | None = None
    min_top1_agreement: float | None = None
    max_mean_kl: float | None = None

    def is_empty(self) -> bool:
        return all(v is None for v in asdict(self).values())

    @classmethod
    def from_recipe(cls, qb: QualityBudget) -> Budget:
        return cls(qb.max_ppl_delta_pct, qb.min_top1_agreement, qb.max_mean_kl)

    def merged(self, **overrides: float | None) -> Budget:
        data = asdict(self)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return Budget(**data)


@dataclass
class ExampleResult:
    """Metrics of one evaluation text."""

    id: str
    tokens: int
    mean_kl: float
    max_kl: float
    max_kl_position: int
    top1_agreement: float
    ref_nll: float
    cand_nll: float
    greedy_exact: bool
    first_divergence: int
    context: str = ""
    ref_top_at_peak: str = ""
    cand_top_at_peak: str = ""
    ref_continuation: str = ""
    cand_continuation: str = ""


@dataclass
class QualityResult:
    """The whole diff: summary metrics, per-position KL, per-example rows, budget verdict."""

    candidate: str
    candidate_kind: str
    reference: str
    reference_kind: str
    dataset: str
    examples: list[ExampleResult]
    kl_by_position_mean: list[float]
    kl_by_position_max: list[float]
    summary: dict[str, float]
    budget: Budget = field(default_factory=Budget)
    violations: list[str] = field(default_factory=list)
    worst: list[ExampleResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "candidate": self.candidate,
            "candidate_kind": self.candidate_kind,
            "reference": self.reference,
            "reference_kind": self.reference_kind,
            "dataset": self.dataset,
            "summary": self.summary,
            "budget": asdict(self.budget),
            "violations": self.violations,
            "worst_examples": [asdict(e) for e in self.worst],
            "kl_by_position": {"mean": self.kl_by_position_mean, "max": self.kl_by_position_max},
            "examples": [asdict(e) for e in self.examples],
            "seconds": round(self.seconds, 3),
        }


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def token_kl(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """KL(ref‖cand) per position, in nats (float64; tiny negative rounding clipped to 0)."""
    lr, lc = log_softmax(ref_logits), log_softmax(cand_logits)
    return np.clip((np.exp(lr) * (lr - lc)).sum(axis=-1), 0.0, None)


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def score_example(
    rec: TextRecord,
    ref: Scorer,
    cand: Scorer,
    max_seq_len: int,
    continuation_tokens: int,
) -> tuple[ExampleResult, np.ndarray]:
    """Metrics of one record plus its per-position KL array."""
    ids = cand.encode(rec.text)[:max_seq_len]
    if len(ids) < 2:
        raise BadInput(f"evaluation record {rec.id!r}: fewer than 2 tokens; nothing to score")
    if ref.encode(rec.text)[: len(ids)] != ids:
        raise BadInput(
            f"reference {ref.path} and candidate {cand.path} tokenize record {rec.id!r} differently; "
            "compare models that share a tokenizer"
        )
    rl, cl = ref.logits(ids), cand.logits(ids)
    if rl.shape != cl.shape:
        raise BadInput(
            f"reference logits {rl.shape} and candidate logits {cl.shape} differ in shape (vocab?)"
        )
    kl = token_kl(rl, cl)
    targets = np.asarray(ids[1:])
    ref_nll = -log_softmax(rl[:-1])[np.arange(len(targets)), targets]
    cand_nll = -log_softmax(cl[:-1])[np.arange(len(targets)), targets]
    prompt_ids = cand.encode(rec.prompt) if rec.prompt else ids[: max(1, len(ids) // 2)]
    prompt_ids = prompt_ids[: max(1, max_seq_len - continuation_tokens)]
    r_cont, c_cont = ref.greedy(prompt_ids, continuation_tokens), cand.greedy(prompt_ids, continuation_tokens)
    first = _first_divergence(r_cont, c_cont)
    peak = int(kl.argmax())
    res = ExampleResult(
        id=rec.id,
        tokens=len(ids),
        mean_kl=float(kl.mean()),
        max_kl=float(kl.max()),
        max_kl_position=peak,
        top1_agreement=float((rl.argmax(-1) == cl.argmax(-1)).mean()),
        ref_nll=float(ref_nll.sum()),
        cand_nll=float(cand_nll.sum()),
        greedy_exact=r_cont == c_cont,
        first_divergence=first,
        context=cand.decode(ids[max(0, peak - 12) : peak + 1]),
        ref_top_at_peak=cand.decode([int(rl[peak].argmax())]),
        cand_top_at_peak=cand.decode([int(cl[peak].argmax())]),
        ref_continuation=ref.decode(r_cont),
        cand_continuation=cand.decode(c_cont),
    )
    return res, kl


def check_budget(summary: dict[str, float], budget: Budget) -> list[str]:
    """Human-readable violations of `budget` (empty when within it)."""
    out = []
    if budget.max_ppl_delta_pct is not None and summary["ppl_delta_pct"] > budget.max_ppl_delta_pct:
        out.append(
            f"perplexity delta {summary['ppl_delta_pct']:+.3f}% > allowed {budget.max_ppl_delta_pct}% "
            f"(ref {summary['ref_ppl']:.4f}, cand {summary['cand_ppl']:.4f})"
        )
    if budget.min_top1_agreement is not None and summary["top1_agreement"] < budget.min_top1_agreement:
        out.append(f"top-1 agreement {summary['top1_agreement']:.4f} < required {budget.min_top1_agreement}")
    if budget.max_mean_kl is not None and summary["mean_kl"] > budget.max_mean_kl:
        out.append(f"mean KL {summary['mean_kl']:.3g} > allowed {budget.max_mean_kl:g}")
    return out


def quality_diff(
    candidate: Scorer,
    reference: Scorer,
    records: Sequence[TextRecord],
    dataset: str = "",
    budget: Budget | None = None,
    max_seq_len: int = 256,
    continuation_tokens: int = 32,
    samples: int | None = None,
    worst_k: int = 5,
) -> QualityResult:
    """Run both models over `records` and compute the diff (see the module docstring)."""
    t0 = time.perf_counter()
    records = list(records)[:samples] if samples else list(records)
    if not records:
        raise BadInput(f"evaluation set {dataset or '(given)'} is empty")
    budget = budget or Budget()
    rows: list[ExampleResult] = []
    kls: list[np.ndarray] = []
    for rec in records:
        row, kl = score_example(rec, reference, candidate, max_seq_len, continuation_tokens)
        rows.append(row)
        kls.append(kl)
    all_kl = np.concatenate(kls)
    width = max(len(k) for k in kls)
    padded = np.full((len(kls), width), np.nan)
    for i, k in enumerate(kls):
        padded[i, : len(k)] = k
    n_pred = sum(r.tokens - 1 for r in rows)
    ref_ppl = math.exp(sum(r.ref_nll for r in rows) / n_pred)
    cand_ppl = math.exp(sum(r.cand_nll for r in rows) / n_pred)
    top1 = float(sum(r.top1_agreement * r.tokens for r in rows) / sum(r.tokens for r in rows))
    summary = {
        "examples": len(rows),
        "tokens": int(all_kl.size),
        "mean_kl": float(all_kl.mean()),
        "max_kl": float(all_kl.max()),
        "top1_agreement": top1,
        "ref_ppl": ref_ppl,
        "cand_ppl": cand_ppl,
        "ppl_delta_pct": 100.0 * (cand_ppl - ref_ppl) / ref_ppl,
        "greedy_exact_match": float(np.mean([r.greedy_exact for r in rows])),
        "mean_first_divergence": float(np.mean([r.first_divergence for r in rows])),
        "continuation_tokens": continuation_tokens,
    }
    worst = sorted(rows, key=lambda r: r.mean_kl, reverse=True)[:worst_k]
    return QualityResult(
        candidate=str(candidate.path),
        candidate_kind=candidate.kind,
        reference=str(reference.path),
        reference_kind=reference.kind,
        dataset=dataset,
        examples=rows,
        kl_by_position_mean=np.nanmean(padded, axis=0).tolist(),
        kl_by_position_max=np.nanmax(padded, axis=0).tolist(),
        summary=summary,
        budget=budget,
        violations=check_budget(summary, budget),
        worst=worst,
        seconds=time.perf_counter() - t0,
    )
