"""Calibration and evaluation text sets: JSONL files under calibration/, one JSON object per line.

Each record has a unique `id`, the `text`, an optional `prompt` (the opening that greedy-continuation checks start
from; defaults to the first half of the text's tokens) and a `source` note. A set comes as a pair of files,
`NAME-calib.jsonl` and `NAME-eval.jsonl`; `check_no_overlap` proves the two splits share no record (same id, same
normalized text, same prompt, or one text containing the other).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmkiln.errors import BadInput
from llmkiln.jsonl import read_jsonl
from llmkiln.recipe import Recipe
from llmkiln.resources import bundled

# The sets a recipe without calibration.dataset / quality_budget.dataset uses (bundled with llmkiln).
DEFAULT_CALIB = "stories-calib"
DEFAULT_EVAL = "stories-eval"


@dataclass(frozen=True)
class TextRecord:
    """One calibration/evaluation example."""

    id: str
    text: str
    prompt: str | None = None
    source: str = ""


def resolve_dataset(name_or_path: str | Path, base: Path | None = None) -> Path:
    """A JSONL set: an absolute path; a path relative to `base` (a recipe's folder) or the working directory; or
    a set bundled with llmkiln, by name (`stories-calib`) or as `calibration/stories-calib.jsonl`."""
    p = Path(name_or_path)
    candidates = [p] if p.is_absolute() else [*([base / p] if base is not None else []), Path.cwd() / p]
    shipped = bundled("calibration")
    if not p.is_absolute() and len(p.parts) <= 2 and p.parts[0] in (p.name, "calibration"):
        candidates.append(shipped / (p.name if p.suffix else f"{p.name}.jsonl"))
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = ", ".join(sorted(x.stem for x in shipped.glob("*.jsonl")))
    raise BadInput(
        f"dataset {str(name_or_path)!r}: no such JSONL file (looked in {', '.join(str(c.parent) for c in candidates)}); "
        f"bundled sets: {known}"
    )


def calib_dataset(recipe: Recipe) -> Path:
    """The recipe's calibration set (calibration.dataset, else the bundled stories set)."""
    return resolve_dataset(recipe.calibration.dataset or DEFAULT_CALIB)


def eval_dataset(recipe: Recipe | None) -> Path:
    """The held-out set: quality_budget.dataset, else calibration.dataset's NAME-eval counterpart, else the
    bundled stories evaluation set."""
    if recipe is not None and recipe.quality_budget.dataset:
        return resolve_dataset(recipe.quality_budget.dataset)
    if recipe is not None and recipe.calibration.dataset:
        return eval_counterpart(resolve_dataset(recipe.calibration.dataset))
    return resolve_dataset(DEFAULT_EVAL)


def load_jsonl(path: str | Path) -> list[TextRecord]:
    """Read and validate a JSONL set (BadInput naming the file and line on any problem)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such dataset file (expected JSONL with a 'text' field per line)")
    records: list[TextRecord] = []
    seen: set[str] = set()
    for lineno, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"{path}:{lineno}: field 'text' must be a non-empty string, got {text!r}")
        rid = str(obj.get("id", f"{path.stem}-{lineno}"))
        if rid in seen:
            raise BadInput(f"{path}:{lineno}: field 'id': duplicate id {rid!r}; ids must be unique")
        seen.add(rid)
        prompt = obj.get("prompt")
        if prompt is not None and (not isinstance(prompt, str) or not text.startswith(prompt)):
            raise BadInput(f"{path}:{lineno}: field 'prompt' must be a string that the text starts with")
        records.append(TextRecord(id=rid, text=text, prompt=prompt, source=str(obj.get("source", ""))))
    if not records:
        raise BadInput(f"{path}: the dataset is empty; add JSONL lines with a 'text' field")
    return records


def eval_counterpart(calib_path: Path) -> Path:
    """calibration/NAME-calib.jsonl → calibration/NAME-eval.jsonl (BadInput if the name does not follow that)."""
    stem = calib_path.stem
    if not stem.endswith("-calib"):
        raise BadInput(
            f"{calib_path}: cannot derive the held-out set; name the file NAME-calib.jsonl next to NAME-eval.jsonl, "
            "or set quality_budget.dataset"
        )
    return calib_path.with_name(stem[: -len("-calib")] + "-eval.jsonl")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def overlaps(calib: Sequence[TextRecord], evals: Sequence[TextRecord]) -> list[tuple[str, str, str]]:
    """(calib id, eval id, reason) for every pair of records that overlap; empty when the splits are disjoint."""
    out: list[tuple[str, str, str]] = []
    c_ids = {r.id: r for r in calib}
    c_text = {_norm(r.text): r.id for r in calib}
    c_prompt = {_norm(r.prompt): r.id for r in calib if r.prompt}
    for e in evals:
        if e.id in c_ids:
            out.append((e.id, e.id, "same id"))
        t = _norm(e.text)
        if t in c_text:
            out.append((c_text[t], e.id, "same text"))
        if e.prompt and _norm(e.prompt) in c_prompt:
            out.append((c_prompt[_norm(e.prompt)], e.id, "same prompt"))
    for c in calib:
        ct = _norm(c.text)
        for e in evals:
            et = _norm(e.text)
            if ct != et and (ct in et or et in ct):
                out.append((c.id, e.id, "one text contains the other"))
    return out


def check_no_overlap(calib: Sequence[TextRecord], evals: Sequence[TextRecord], what: str = "") -> None:
    """Raise BadInput when the calibration and evaluation splits share any record."""
    bad = overlaps(calib, evals)
    if bad:
        shown = "; ".join(f"{c} ~ {e} ({why})" for c, e, why in bad[:5])
        raise BadInput(
            f"{what or 'datasets'}: calibration and evaluation splits overlap in {len(bad)} place(s): {shown}. "
            "Evaluate on held-out text only."
        )


def texts(records: Iterable[TextRecord], limit: int | None = None) -> list[str]:
    """The texts of the first `limit` records."""
    out = [r.text for r in records]
    return out if limit is None else out[:limit]
