"""kiln quality-diff on stories260K engines: fp32 is exact, int8 is close and in budget, int4 fails a strict one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmkiln.calibration.quality_diff import Budget, check_budget, token_kl
from llmkiln.cli.main import main


def _kiln(*argv: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    return int(exc.value.code)


def test_token_kl_and_budget_logic() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 11)).astype(np.float32)
    assert np.all(token_kl(a, a) < 1e-12)
    b = a + rng.normal(scale=0.5, size=a.shape).astype(np.float32)
    assert np.all(token_kl(a, b) > 0)
    summary = {
        "ppl_delta_pct": 2.0,
        "ref_ppl": 3.0,
        "cand_ppl": 3.06,
        "top1_agreement": 0.95,
        "mean_kl": 0.01,
    }
    assert check_budget(summary, Budget()) == []
    assert check_budget(summary, Budget(3.0, 0.9, 0.02)) == []
    violations = check_budget(summary, Budget(1.0, 0.97, 0.001))
    assert len(violations) == 3 and "perplexity" in violations[0]


@pytest.mark.slow
def test_fp32_engine_matches_hf_exactly(engine_factory, tmp_path: Path) -> None:
    from llmkiln.calibration.quality_run import run_quality_diff

    engine = engine_factory("stories-fp32")
    run = run_quality_diff(engine, samples=8, out_dir=tmp_path / "q")
    s = run.result.summary
    assert run.result.reference_kind == "hf-fp32" and run.result.candidate_kind == "onnx-engine"
    assert s["mean_kl"] < 1e-6 and s["max_kl"] < 1e-6
    assert s["top1_agreement"] == 1.0 and s["greedy_exact_match"] == 1.0
    assert abs(s["ppl_delta_pct"]) < 1e-3
    data = json.loads(run.report["json"].read_text())
    assert data["passed"] and len(data["kl_by_position"]["mean"]) > 100
    assert run.report["png"].read_bytes()[:4] == b"\x89PNG"
    assert "Quality diff" in run.report["markdown"].read_text()


@pytest.mark.slow
def test_int8_engine_is_quantized_and_within_its_budget(engine_factory) -> None:
    engine = engine_factory("stories-int8")
    manifest = json.loads((engine / "manifest.json").read_text())
    q = manifest["calibration"]["quality"]
    assert q["passed"] and not q["regression_allowed"]
    s = q["summary"]
    assert 0 < s["mean_kl"] <= q["budget"]["max_mean_kl"]
    assert s["top1_agreement"] >= q["budget"]["min_top1_agreement"] and s["top1_agreement"] < 1.0
    assert s["ppl_delta_pct"] <= q["budget"]["max_ppl_delta_pct"]
    report = engine / q["report"]
    assert report.is_file() and (report.parent / "kl_by_position.png").is_file()
    assert "calibration/quality/quality_report.json" in manifest["engine_files"]


@pytest.mark.slow
def test_int4_against_a_strict_budget_exits_1_and_names_the_worst(
    engine_factory, tmp_path: Path, capsys
) -> None:
    engine = engine_factory("stories-int4")
    out = tmp_path / "q4"
    rc = _kiln("quality-diff", str(engine), "--budget-ppl-pct", "1", "--budget-top1", "0.97",
               "--budget-kl", "0.005", "--samples", "6", "--continuation-tokens", "8", "--out", str(out))  # fmt: skip
    assert rc == 1
    err = capsys.readouterr().err
    assert "outside its quality budget" in err and "Worst examples: stories-eval-" in err
    data = json.loads((out / "quality_report.json").read_text())
    assert not data["passed"] and len(data["violations"]) == 3
    worst = [e["id"] for e in data["worst_examples"]]
    assert worst and all(w in (out / "quality_report.md").read_text() for w in worst)
    assert data["worst_examples"][0]["mean_kl"] == max(e["mean_kl"] for e in data["examples"])


@pytest.mark.slow
def test_bad_input_exits_2(engine_factory, tmp_path: Path) -> None:
    engine = engine_factory("stories-fp32")
    assert _kiln("quality-diff", str(tmp_path / "missing")) == 2
    assert _kiln("quality-diff", str(engine), "--dataset", "calibration/nope.jsonl") == 2
    (tmp_path / "empty").mkdir()
    assert _kiln("quality-diff", str(tmp_path / "empty")) == 2
    assert _kiln("quality-diff", str(engine), "--samples", "0") == 2


@pytest.mark.slow
def test_reference_can_be_an_engine(engine_factory, tmp_path: Path) -> None:
    from llmkiln.calibration.quality_run import run_quality_diff

    run = run_quality_diff(engine_factory("stories-int8"), reference=engine_factory("stories-fp32"), samples=3,
                           continuation_tokens=4, out_dir=tmp_path / "q")  # fmt: skip
    assert run.result.reference_kind == "onnx-engine" and 0 < run.result.summary["mean_kl"] < 0.005


@pytest.mark.slow
def test_hf_checkpoint_folder_opens_as_the_fake_quant_model(fp8_calibration) -> None:
    from llmkiln.calibration.candidates import FakeQuantScorer, default_reference, open_scorer

    scorer = open_scorer(fp8_calibration.hf_checkpoint_dir)
    assert isinstance(scorer, FakeQuantScorer)
    assert default_reference(fp8_calibration.hf_checkpoint_dir) == Path(fp8_calibration.meta["source"])
