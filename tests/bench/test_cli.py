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


def test_workload_options_are_one_definition():
    """`kiln bench`, `kiln bench run` and `kiln profile` take the same workload options with the same defaults
    (llmkiln/cli/options.py); only the sweep's defaults (concurrency, requests, warmup) are the command's."""
    from llmkiln.cli.bench_cmd import bench, run_cmd
    from llmkiln.cli.profile_cmd import profile

    def opts(cmd):
        return {p.name: (p.opts, p.default, p.help, repr(p.type)) for p in cmd.params}

    workload = {
        "workload", "jsonl", "seed", "output_tokens", "system_tokens", "system_prompts", "user_tokens",
        "prompt_tokens", "long_tokens", "short_tokens", "long_every",
    }  # fmt: skip
    a, b, c = opts(bench), opts(run_cmd), opts(profile)
    assert workload <= set(a) and workload <= set(c)
    for name in workload:
        assert a[name] == b[name] == c[name], name
    for name in ("concurrency", "requests_", "warmup_requests"):
        assert a[name][0] == c[name][0] and a[name][2] == c[name][2], name  # same option, own default
