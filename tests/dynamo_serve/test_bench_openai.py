"""`kiln bench` against the real OpenAI endpoint (Dynamo frontend, one llmkiln worker): streaming chat and
completions, cached tokens from usage, an open loop with goodput."""

from __future__ import annotations

import json

import pytest

from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.stats import Slo
from llmkiln.bench.workloads import WorkloadSpec, build_workload, load_tokenizer
from llmkiln.cli.main import main

from .conftest import MODEL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(launch, stories_engine):
    return launch(stories_engine, workers=1)


def test_chat_open_loop_reports_hits_and_goodput(cluster, stories_engine):
    tok = load_tokenizer(stories_engine)
    spec = WorkloadSpec(
        num_requests=10, system_tokens=120, user_tokens=(8, 16), output_tokens=6, num_system_prompts=2
    )
    cfg = BenchConfig(
        url=cluster.url,
        model=MODEL,
        workload=build_workload(tok, spec),
        concurrency=(8,),
        requests_per_level=8,
        warmup_requests=2,
        api="chat",
        request_rate=20.0,
        slo=Slo(ttft_ms=60_000, tpot_ms=60_000),
        progress=False,
    )
    report, records = run_bench(cfg)
    lv = report.levels[0]
    assert lv.num_ok == 8 and lv.num_errors == 0
    assert report.run.api == "chat" and lv.request_rate == 20.0
    assert all(r.num_output_tokens == 6 and r.server["prompt_tokens"] > 120 for r in records[8])
    assert lv.prefix_hit_rate is not None and lv.prefix_hit_rate > 0.5  # two prompts, warm cache
    assert lv.goodput is not None and lv.goodput.good_requests == 8 and lv.goodput.attainment == 1.0


def test_cli_completions_closed_loop(cluster, stories_engine, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        main(
            [
                "bench",
                "--api",
                "completions",
                "--url",
                cluster.url,
                "--tokenizer",
                str(stories_engine),
                "--system-tokens",
                "64",
                "--user-tokens",
                "8",
                "--output-tokens",
                "4",
                "--concurrency",
                "2",
                "--requests",
                "4",
                "--no-progress",
                "--slo-ttft-ms",
                "60000",
                "--out",
                str(out),
            ]
        )
    assert done.value.code == 0
    level = json.loads(out.read_text())["levels"][0]
    assert level["num_ok"] == 4 and level["goodput"]["slo"] == {"ttft_ms": 60000.0, "tpot_ms": 100.0}
