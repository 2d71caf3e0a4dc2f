"""scripts/cpu_kernel_study.sh --quick runs end to end on stories260K (every step of the study and of the runner
loops, tiny shapes; the OpenVINO venv's studies left out: they install from PyPI), so the script cannot rot
unnoticed. Structure only: what each step wrote, never how fast it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HAS_BF16

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(engine_factory) -> Path:
    """The session's engines root, with the two engines the quick study uses (its `kiln build` finds them)."""
    root = engine_factory("stories-fp32").parent
    assert engine_factory("stories-ov-fp32").parent == root
    return root


def test_the_kernel_study_script_runs_in_quick_mode(tmp_path, stories_dir, engines):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PY": sys.executable,
        "WORK": str(tmp_path / "work"),
        "ENGINES": str(engines),
        "STORIES": str(stories_dir),
    }
    env.pop("QUICK", None)
    env.pop("SKIP_OV", None)
    run = subprocess.run(
        ["bash", "scripts/cpu_kernel_study.sh", "--quick", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    dtypes = ["fp32", "bf16"] if HAS_BF16 else ["fp32"]
    ov = [f"ov-{dt}" for dt in dtypes]
    study = ["gemm", "ort-fp32", "ort-int8-acc4", "quality"]
    study += [f"{p}-{dt}" for p in ("torch", "hf") for dt in dtypes]
    loops = ["ort", "ort-c1", *(f"torch-{dt}" for dt in dtypes), *ov]
    loops += [f"{ov[-1]}-{v}" for v in ("alone", "mpt256", "mpt1024", "c1")]
    written = {f.stem for f in out.glob("*.json")}
    assert written == {*study, *(f"loop-{r}" for r in loops)}
    results = {name: json.loads((out / f"{name}.json").read_text()) for name in written}

    for name in ("ort-fp32", "ort-int8-acc4"):
        assert {"start", "end", "decode_b1", "suffix_prefill_8_one_at_a_time", "cold_prefill_2048"} <= set(
            results[name]
        ), name
    for dt in dtypes:
        d = results[f"torch-{dt}"]
        assert {"decode_b1_dense", "decode_b1_cascade", "suffix_prefill_8_batched_cascade"} <= set(d), dt
        assert {"cold_prefill_2048"} <= set(results[f"hf-{dt}"])
    assert set(results["quality"]) == {f"torch {dt}" for dt in dtypes} | {"ort int8 accuracy_level 4"}
    for q in results["quality"].values():
        assert 0.0 <= q["top1_agreement"] <= 1.0 and q["mean_kl"] >= 0.0
    for r in loops:
        d = results[f"loop-{r}"]
        base = max((n for n in ("ort", *(f"torch-{dt}" for dt in dtypes), *ov) if r.startswith(n)), key=len)
        assert d["runner"].split(" ")[0] == base, r
        assert d["rounds"] == 1 and len(d["per_round"]) == 1 and d["requests"] == 4, r
        assert d["prefix_cache_hit_rate"] > 0.0, r  # the shared system prompt is found again
    assert results[f"loop-{ov[-1]}-c1"]["concurrency"] == 1

    summary = (out / "SUMMARY.md").read_text()
    assert "onnxruntime 1.32 CPU EP" in summary and "TorchLlama" in summary and "transformers" in summary
    assert "| runner (in-process) |" in summary
    for r in ("ort", "torch-fp32", "ov-fp32"):
        assert f"\n| {r} |" in summary, r
