"""`kiln bench` argument handling: bad input exits 2 (no server needed)."""

from __future__ import annotations

import json

import pytest

from llmkiln.cli.main import main


def run(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


@pytest.mark.parametrize("levels", ["1,x", "0,4", "", "4,4", "-1"])
def test_bad_concurrency(levels):
    assert run(["bench", "--concurrency", levels]) == 2
    assert run(["bench", "run", "--concurrency", levels]) == 2


def test_missing_jsonl(tmp_path):
    assert run(["bench", "--from-jsonl", str(tmp_path / "none.jsonl"), "--concurrency", "1"]) == 2


def test_synthetic_without_tokenizer():
    assert run(["bench", "--workload", "unique", "--concurrency", "1", "--requests", "1"]) == 2


def test_non_loopback_url(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert run(["bench", "--url", "10.1.2.3:8001", "--from-jsonl", str(f), "--concurrency", "1"]) == 2


def test_bad_requests():
    assert run(["bench", "--requests", "0"]) == 2


def test_compare_cli(tmp_path, capsys, report_factory):
    fake_report = report_factory
    from llmkiln.bench.report import save_report

    save_report(fake_report("base", {8: [1000, 1000, 1000]}), tmp_path / "a.json")
    save_report(fake_report("opt", {8: [200, 200, 200]}), tmp_path / "b.json")
    assert (
        run(
            [
                "bench",
                "compare",
                str(tmp_path / "a.json"),
                str(tmp_path / "b.json"),
                "--out",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "-80.0%" in out
    changes = json.loads((tmp_path / "c.json").read_text())
    assert any(
        c["metric"] == "ttft_ms" and c["stat"] == "p50" and abs(c["change"] + 0.8) < 1e-9 for c in changes
    )
    assert run(["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "missing.json")]) == 2
