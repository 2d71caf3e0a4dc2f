"""Calibration/evaluation sets: they load, they are documented, and the splits never overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmkiln.calibration.datasets import (
    TextRecord,
    check_no_overlap,
    eval_counterpart,
    load_jsonl,
    overlaps,
    resolve_dataset,
)
from llmkiln.errors import BadInput
from llmkiln.resources import bundled

SETS = ("stories", "chat", "english", "chatml")


@pytest.mark.parametrize("name", SETS)
def test_calib_and_eval_splits_never_overlap(name: str) -> None:
    calib = load_jsonl(resolve_dataset(f"calibration/{name}-calib.jsonl"))
    evals = load_jsonl(eval_counterpart(resolve_dataset(f"{name}-calib")))
    assert len(calib) >= 16 and len(evals) >= 8
    assert overlaps(calib, evals) == []
    check_no_overlap(calib, evals)
    assert not {r.id for r in calib} & {r.id for r in evals}
    assert not {r.text for r in calib} & {r.text for r in evals}


def test_every_set_has_a_readme_entry_with_origin_and_license() -> None:
    readme = (bundled("calibration") / "README.md").read_text()
    files = sorted(p.name for p in bundled("calibration").glob("*.jsonl"))
    assert files
    for f in files:
        line = next((ln for ln in readme.splitlines() if f"`{f}`" in ln), None)
        assert line is not None, f"{f} is not listed in calibration/README.md"
        assert "Apache-2.0" in line or "MIT" in line  # a license on the same row


def test_overlap_is_detected() -> None:
    a = [TextRecord("a1", "Once upon a time there was a cat.", "Once upon a time")]
    same_text = [TextRecord("b1", "once upon a time  there was a cat.")]
    same_prompt = [TextRecord("b2", "Once upon a time there was a dog.", "Once upon a time")]
    contained = [TextRecord("b3", "Once upon a time there was a cat. It slept.")]
    same_id = [TextRecord("a1", "Something else entirely.")]
    for evals, why in (
        (same_text, "same text"),
        (same_prompt, "same prompt"),
        (contained, "one text contains the other"),
        (same_id, "same id"),
    ):
        assert why in [r for _, _, r in overlaps(a, evals)]
        with pytest.raises(BadInput, match="overlap"):
            check_no_overlap(a, evals)


def test_bad_files_are_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(BadInput, match=r"bad.jsonl:2: not valid JSON"):
        load_jsonl(bad)
    bad.write_text(json.dumps({"id": "x", "text": ""}) + "\n")
    with pytest.raises(BadInput, match="'text'"):
        load_jsonl(bad)
    bad.write_text(json.dumps({"id": "x", "text": "a"}) + "\n" + json.dumps({"id": "x", "text": "b"}) + "\n")
    with pytest.raises(BadInput, match="duplicate id"):
        load_jsonl(bad)
    with pytest.raises(BadInput, match="no such JSONL"):
        resolve_dataset("calibration/nope.jsonl")
    with pytest.raises(BadInput, match="NAME-calib.jsonl"):
        eval_counterpart(bad)
