"""A real short benchmark: tritonserver on 127.0.0.1 serving the stories-fp32 engine, concurrency 1,2."""

from __future__ import annotations

import json

import pytest

from llmkiln.bench.report import load_report
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.serving import serve_engine
from llmkiln.bench.workloads import WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(engine_factory, stories_dir):
    engine = engine_factory("stories-fp32")
    with serve_engine(engine, ready_timeout_s=300) as s:
        yield s, engine


def test_short_bench_produces_a_valid_report(served, tmp_path):
    s, engine = served
    tok = load_tokenizer(engine)
    spec = WorkloadSpec(
        name="shared-prefix", num_requests=1 + 3 + 3, system_tokens=64, user_tokens=(8, 16), output_tokens=8
    )
    wl = build_workload(tok, spec)
    cfg = BenchConfig(
        url=s.url,
        model=s.model,
        workload=wl,
        concurrency=[1, 2],
        requests_per_level=3,
        warmup_requests=1,
        progress=False,
    )
    report, records = run_bench(cfg)
    assert [lv.concurrency for lv in report.levels] == [1, 2]
    for lv in report.levels:
        assert lv.num_requests == 3 and lv.num_errors == 0, lv.errors
        assert lv.ttft_ms.count == 3 and lv.ttft_ms.p50 > 0
        assert lv.server_ttft_ms.count == 3 and 0 < lv.server_ttft_ms.p50
        assert lv.e2e_ms.p50 >= lv.ttft_ms.p50
        assert lv.output_token_throughput > 0
        assert lv.prompt_tokens_mean is not None and 72 <= lv.prompt_tokens_mean <= 80
    recs = [r for rs in records.values() for r in rs]
    assert all(1 <= r.num_output_tokens <= 8 for r in recs)
    assert all(r.token_ns == sorted(r.token_ns) and r.send_ns < r.token_ns[0] <= r.end_ns for r in recs)
    # The system prompt (64 tokens + BOS) was cached by the warmup request: the server reports reused tokens.
    assert all(r.num_cached_tokens is not None for r in recs)
    assert max(r.num_cached_tokens for r in recs) >= 16


def test_cli_bench_against_the_server(served, tmp_path):
    s, engine = served
    out = tmp_path / "report.json"
    argv = ["bench", "--url", s.url, "--model", s.model, "--tokenizer", str(engine), "--workload", "unique"]
    argv += ["--prompt-tokens", "20-40", "--output-tokens", "4", "--concurrency", "1,2", "--requests", "2"]
    argv += [
        "--out",
        str(out),
        "--plot",
        str(tmp_path / "cdf.png"),
        "--raw-out",
        str(tmp_path / "raw.jsonl"),
        "--no-progress",
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    rep = load_report(out)
    assert rep.run.mode == "cold" and rep.run.workload["name"] == "unique"
    assert [lv.num_ok for lv in rep.levels] == [2, 2]
    assert (tmp_path / "cdf.png").read_bytes()[:4] == b"\x89PNG"
    lines = (tmp_path / "raw.jsonl").read_text().splitlines()
    assert len(lines) == 4 and {json.loads(x)["concurrency"] for x in lines} == {1, 2}


def test_rejected_requests_are_counted_not_raised(served, tmp_path):
    s, engine = served
    f = tmp_path / "traffic.jsonl"
    too_long = " ".join(["once upon a time"] * 200)  # far over stories-fp32's max_input_len (384)
    f.write_text(
        json.dumps({"prompt": "Once upon a time", "max_tokens": 3})
        + "\n"
        + json.dumps({"prompt": too_long})
        + "\n"
    )
    out = tmp_path / "r.json"
    argv = [
        "bench",
        "--url",
        s.url,
        "--model",
        s.model,
        "--from-jsonl",
        str(f),
        "--concurrency",
        "2",
        "--requests",
        "2",
    ]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out), "--no-progress"])
    assert exc.value.code == 1  # the report is written, then the failures make the command fail
    lv = load_report(out).levels[0]
    assert lv.num_ok == 1 and lv.num_errors == 1
    assert "too long" in lv.errors[0].lower() or "max_input_len" in lv.errors[0]
