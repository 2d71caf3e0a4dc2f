"""`kiln lint-prompts`: exit codes for CI, --json, --fix, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmkiln.cli.main import cli
from llmkiln.engine_dir import EngineDir
from llmkiln.lint.dynamic import find_spans
from tests.lint.runtime_helpers import write_jsonl


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=True)
    code = result.return_value if isinstance(result.return_value, int) else result.exit_code
    if result.exception is not None and hasattr(result.exception, "exit_code"):
        code = result.exception.exit_code
    return code, result.output


def _rows() -> list[dict]:
    return [
        {
            "prompt": f"Request id 7f3a9c{i:02d}e1: you tell short stories about a cat and a dog who live in a "
            f"little house near the sea, with simple words and a happy end.\nStory {i}:"
        }
        for i in range(8)
    ]


def test_min_hit_rate_json_and_fix(tmp_path: Path, stories_engine: EngineDir) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", _rows())
    fixed = tmp_path / "fixed.jsonl"
    code, out = _run(
        [
            "lint-prompts",
            str(path),
            "--engine",
            str(stories_engine.path),
            "--json",
            "--min-hit-rate",
            "0.5",
            "--fix",
            str(fixed),
        ]
    )
    report = json.loads(out)
    assert code == 1  # below the bar: CI fails
    assert report["findings"][0]["cause"] == "dynamic-content"
    assert report["after_request_fixes"]["token_hit_rate"] > report["baseline"]["token_hit_rate"]
    lines = [json.loads(x) for x in fixed.read_text().splitlines()]
    assert lines[0]["prompt"].startswith("you tell short stories") and "7f3a9c00e1" in lines[0]["prompt"]
    code, out = _run(
        ["lint-prompts", str(fixed), "--engine", str(stories_engine.path), "--min-hit-rate", "0.5"]
    )
    assert code == 0, out
    assert "meets --min-hit-rate" in out


def test_bad_input_is_exit_2(tmp_path: Path, stories_engine: EngineDir) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    code, out = _run(["lint-prompts", str(bad), "--engine", str(stories_engine.path)])
    assert code == 2
    code, _ = _run(["lint-prompts", str(tmp_path / "missing.jsonl"), "--engine", str(stories_engine.path)])
    assert code == 2


def test_dynamic_patterns() -> None:
    text = (
        "At 2026-11-30T12:03:11Z (12:30 PM, Monday, November 30, 2026), request "
        "7f3a9c2e-1111-2222-3333-444455556666 / req_8f3k2j for user 42 on 30/11/2026 ts 1764500000."
    )
    kinds = [(s.kind, text[s.start : s.end]) for s in find_spans(text)]
    assert kinds == [
        ("timestamp", "2026-11-30T12:03:11Z"),
        ("time", "12:30 PM"),
        ("date", "Monday, November 30, 2026"),
        ("uuid", "7f3a9c2e-1111-2222-3333-444455556666"),
        ("id", "req_8f3k2j"),
        ("counter", "42"),
        ("date", "30/11/2026"),
        ("timestamp", "1764500000"),
    ]
