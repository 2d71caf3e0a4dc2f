"""`python -m llmkiln.trtllm.smoke speculative` (what scripts/gpu_verify.sh speculative runs) against a fake
tensorrt_llm: it passes only when the speculative run drafted tokens, and reports the acceptance rate."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmkiln.trtllm import smoke

SPEC = {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3}


def _fake_tensorrt_llm(drafted: int, accepted: int) -> types.ModuleType:
    """LLM(**kwargs).generate/get_stats/shutdown the way measure_speculative uses them; the speculative run's
    iteration stats carry specDecodingStats with `drafted` / `accepted` tokens."""
    mod = types.ModuleType("tensorrt_llm")

    class SamplingParams:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            assert kwargs["enable_iter_perf_stats"] is True
            self.spec = "speculative_config" in kwargs

        def generate(self, prompts: list[str], params: SamplingParams) -> list[Any]:
            n = params.kwargs["max_tokens"]
            return [
                types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[1] * n)]) for _ in prompts
            ]

        def get_stats(self, timeout: float) -> list[Any]:
            if not self.spec:
                return [{"iter": 0}]
            stats = {"specDecodingStats": {"numDraftTokens": drafted, "numAcceptedTokens": accepted}}
            return [json.dumps(stats)]  # TensorRT-LLM hands JSON strings

        def shutdown(self) -> None:
            pass

    mod.LLM = LLM  # type: ignore[attr-defined]
    mod.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    return mod


@pytest.fixture()
def engine(tmp_path: Path) -> Path:
    eng = tmp_path / "tiny-trtllm-llmapi-ngram"
    (eng / "hf_checkpoint").mkdir(parents=True)
    (eng / "llm_api_options.yaml").write_text(
        yaml.safe_dump({"max_batch_size": 4, "speculative_config": SPEC})
    )
    return eng


def _run(monkeypatch: pytest.MonkeyPatch, engine: Path, out: Path, drafted: int, accepted: int) -> int:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", _fake_tensorrt_llm(drafted, accepted))
    return smoke._main(["speculative", str(engine), "--out", str(out), "--max-tokens", "8"])


def test_speculative_passes_and_reports_the_acceptance_rate_when_tokens_were_drafted(
    monkeypatch: pytest.MonkeyPatch, engine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    assert _run(monkeypatch, engine, out, drafted=40, accepted=30) == 0
    (result_file,) = out.glob("*-speculative.json")
    result = json.loads(result_file.read_text())
    assert result["with"]["drafted_tokens"] == 40 and result["with"]["acceptance_rate"] == 0.75
    assert result["without"]["drafted_tokens"] == 0 and result["problems"] == []
    assert result["speculative_config"] == SPEC
    printed = capsys.readouterr().out
    assert "acceptance rate 0.75" in printed and "30 accepted / 40 drafted" in printed


def test_speculative_fails_when_nothing_was_drafted(
    monkeypatch: pytest.MonkeyPatch, engine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    assert _run(monkeypatch, engine, out, drafted=0, accepted=0) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "drafted no tokens" in err
    (result_file,) = out.glob("*-speculative.json")  # the numbers are kept for the record
    assert json.loads(result_file.read_text())["with"]["acceptance_rate"] is None


def test_speculative_problems_is_the_gate() -> None:
    base = {"speculative_config": SPEC, "without": {"drafted_tokens": 0, "accepted_tokens": 0}}
    ok = base | {"with": {"drafted_tokens": 8, "accepted_tokens": 0, "acceptance_rate": 0.0}}
    # drafted but nothing accepted: measured (a bad rate, not a bug)
    assert smoke.speculative_problems(ok) == []
    bad = base | {"with": {"drafted_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None}}
    assert smoke.speculative_problems(bad)
