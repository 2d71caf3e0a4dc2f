"""`kiln diagnose` on recorded metric snapshots and bench reports: one test per symptom row, plus the overlay."""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmkiln.cli.main import cli
from llmkiln.diagnose.diagnosis import Diagnosis, diagnose
from llmkiln.errors import BadInput
from llmkiln.lint.lint import lint_prompts
from llmkiln.recipe import load_recipe, resolve_model_path

FIXTURES = Path(__file__).parent / "fixtures"
STORIES_PROM = FIXTURES / "stories-fp32_shared-prefix.prom"
STORIES_BENCH = FIXTURES / "stories-fp32_shared-prefix.bench.json"
QUEUE_PROM = FIXTURES / "diag-queue_shared-prefix.prom"
QUEUE_BENCH = FIXTURES / "diag-queue_shared-prefix.bench.json"


def _row(d: Diagnosis, symptom: str):
    return next(r for r in d.rows if r.symptom.startswith(symptom))


def _status(d: Diagnosis) -> dict[str, str]:
    return {r.symptom: r.status for r in d.rows}


def _edited(tmp_path: Path, source: Path, edits: dict[str, str], name: str) -> Path:
    """A copy of a recorded snapshot with the value of each sample line starting with a key replaced."""
    text = source.read_text()
    for prefix, value in edits.items():
        text, n = re.subn(rf"^({re.escape(prefix)}\S*) \S+$", rf"\g<1> {value}", text, flags=re.M)
        assert n >= 1, prefix
    out = tmp_path / name
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def stories():
    return load_recipe("stories-fp32")[0]


@pytest.fixture(scope="module")
def queue_recipe():
    return load_recipe(FIXTURES / "diag-queue.yaml")[0]


def test_real_snapshot_spikes(stories) -> None:
    # stories-fp32 under c=1,4,8: p50 19 ms but p95/p99 near 200 ms (eight prefills at once at c=8)
    d = diagnose([], [STORIES_PROM], stories)
    spikes = _row(d, "p95/p99")
    assert spikes.status == "yes"
    assert spikes.changes == {"scheduler.max_prefill_tokens": 256}
    assert any("p99/p50 = 10.4" in f for f in spikes.figures)
    st = _status(d)
    assert st["high TTFT, low utilization"] == "no"  # the runtime's queue is 3.4 ms of 78 ms
    assert st["high TTFT with long prefill"] == "no"  # 78% of prompt tokens hit the cache
    assert st["requests rejected"] == "no"
    assert d.figures["hit_rate"]["value"] == pytest.approx(4416 / 5677)


def test_real_snapshot_and_report_queueing(queue_recipe) -> None:
    # static batches of 2 with a 100 ms batch timeout: most of TTFT is waiting
    d = diagnose([], [QUEUE_PROM, QUEUE_BENCH], queue_recipe)
    q = _row(d, "high TTFT, low utilization")
    assert q.status == "yes"
    assert q.changes["scheduler.batching"] == "inflight"
    assert any(f.startswith("queue share of TTFT = 67%") for f in q.figures)
    # no prefix reuse and a third of TTFT in prefill: cache misses too
    lp = _row(d, "high TTFT with long prefill")
    assert lp.status == "yes" and lp.changes == {"kv_cache.prefix_reuse": True}


def test_long_prefill_from_cache_misses(tmp_path: Path, stories) -> None:
    snap = _edited(tmp_path, STORIES_PROM, {"llmkiln_prefix_cache_hit_tokens_total": "0"}, "misses.prom")
    d = diagnose([], [snap], stories)
    lp = _row(d, "high TTFT with long prefill")
    assert lp.status == "yes"
    assert any("prefix-cache hit rate = 0%" in f for f in lp.figures)
    assert any("prefill share of TTFT = 96%" in f for f in lp.figures)


def test_kv_budget_crowding(tmp_path: Path, stories) -> None:
    snap = _edited(
        tmp_path,
        STORIES_PROM,
        {
            'llmkiln_engine{metric="kv_blocks_used"': "3276",
            'llmkiln_engine{metric="kv_blocks_evicted"': "412",
        },
        "crowded.prom",
    )
    d = diagnose([], [snap], stories)
    kv = _row(d, "cache on but throughput down")
    assert kv.status == "yes"
    assert kv.changes == {"kv_cache.max_bytes": stories.kv_cache.max_bytes // 2}
    # evictions also make the long-prefill row ask for a bigger store only when it fires: here it does not
    assert _row(d, "high TTFT with long prefill").status == "no"


def test_cold_start_from_a_real_bench_report(stories) -> None:
    # the recorded cold run: the first request took 116 ms, the rest of its level a median of 17 ms
    d = diagnose([], [STORIES_BENCH], stories)
    cold = _row(d, "cold-start")
    assert cold.status == "yes"
    assert any("first request TTFT = 116.4 ms" in f for f in cold.figures)


def test_cold_start_from_metrics_without_warmup(tmp_path: Path, stories) -> None:
    snap = _edited(tmp_path, STORIES_PROM, {"llmkiln_warmup_requests_total": "0"}, "nowarm.prom")
    d = diagnose([], [snap], stories)
    assert _row(d, "cold-start").status == "yes"
    assert diagnose([], [STORIES_PROM], stories).rows[4].status == "no"  # the recorded server did warm up


def test_rejections(tmp_path: Path, stories) -> None:
    snap = _edited(tmp_path, STORIES_PROM, {"llmkiln_requests_rejected_total": "7"}, "rejected.prom")
    d = diagnose([], [snap], stories)
    rej = _row(d, "requests rejected")
    assert rej.status == "yes" and rej.changes == {"scheduler.max_queue_size": 128}


def test_triton_only_metrics(tmp_path: Path) -> None:
    # only Triton's own families (a non-llmkiln model): queue from nv_inference_queue_duration_us
    text = "\n".join(
        line
        for line in STORIES_PROM.read_text().splitlines()
        if "llmkiln_" not in line or line.startswith("#")
    )
    snap = tmp_path / "triton.prom"
    snap.write_text(text + "\n")
    d = diagnose([], [snap], None)
    assert d.figures["queue_ms"]["value"] == pytest.approx(48372 / 25 / 1000)
    assert d.figures["queue_ms"]["source"].startswith("nv_inference_queue_duration_us")
    assert _row(d, "high TTFT, low utilization").status == "no data"  # no TTFT without the histogram


DYNAMO_SNAPSHOT = """\
# TYPE dynamo_frontend_time_to_first_token_seconds histogram
dynamo_frontend_time_to_first_token_seconds_bucket{model="stories",le="0.01"} 10
dynamo_frontend_time_to_first_token_seconds_bucket{model="stories",le="0.05"} 90
dynamo_frontend_time_to_first_token_seconds_bucket{model="stories",le="0.5"} 95
dynamo_frontend_time_to_first_token_seconds_bucket{model="stories",le="2"} 100
dynamo_frontend_time_to_first_token_seconds_bucket{model="stories",le="+Inf"} 100
dynamo_frontend_time_to_first_token_seconds_sum{model="stories"} 6.5
dynamo_frontend_time_to_first_token_seconds_count{model="stories"} 100
# TYPE dynamo_frontend_input_sequence_tokens histogram
dynamo_frontend_input_sequence_tokens_bucket{model="stories",le="+Inf"} 100
dynamo_frontend_input_sequence_tokens_sum{model="stories"} 30000
dynamo_frontend_input_sequence_tokens_count{model="stories"} 100
# TYPE dynamo_frontend_cached_tokens histogram
dynamo_frontend_cached_tokens_bucket{model="stories",le="+Inf"} 100
dynamo_frontend_cached_tokens_sum{model="stories"} 6000
dynamo_frontend_cached_tokens_count{model="stories"} 100
# TYPE dynamo_frontend_inflight_requests gauge
dynamo_frontend_inflight_requests{model="stories"} 2
# TYPE dynamo_frontend_queued_requests gauge
dynamo_frontend_queued_requests{model="stories"} 0
# TYPE dynamo_frontend_model_max_num_seqs gauge
dynamo_frontend_model_max_num_seqs{model="stories"} 8
"""


def test_dynamo_frontend_metrics(tmp_path: Path, stories) -> None:
    snap = tmp_path / "dynamo.prom"
    snap.write_text(DYNAMO_SNAPSHOT)
    d = diagnose([], [snap], stories)
    assert d.figures["hit_rate"]["value"] == pytest.approx(0.2)
    assert d.figures["utilization"]["value"] == pytest.approx(0.25)
    assert d.figures["ttft_p50_ms"]["value"] == pytest.approx(10 + 40 * (50 - 10) / 80)
    spikes = _row(d, "p95/p99")
    assert spikes.status == "yes"  # p99 in the 0.5-2 s bucket against a 30 ms median
    assert any("do not split TTFT" in n for n in d.notes)

    # scrape the same text from a live endpoint (a loopback HTTP server), combined with a bench report
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = DYNAMO_SNAPSHOT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        live = diagnose([url], [STORIES_BENCH], stories)
    finally:
        server.shutdown()
        thread.join()
    assert live.sources == [url, str(STORIES_BENCH)]
    assert live.figures["ttft_p50_ms"] == d.figures["ttft_p50_ms"]  # metrics first, then the report
    assert live.figures["first_ttft_ms"]["source"].startswith("bench report")


def test_recipe_overlay_extends_and_validates(tmp_path: Path, stories) -> None:
    out = tmp_path / "stories-fp32-diagnosed.yaml"
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["diagnose", str(STORIES_PROM), "--recipe", "stories-fp32", "--recipe-overlay", str(out), "--json"],
        standalone_mode=False,
        catch_exceptions=False,
    )
    d = json.loads(result.output)
    assert d["overlay"] == str(out) and d["changes"] == {"scheduler.max_prefill_tokens": 256}
    text = out.read_text()
    assert "extends: stories-fp32" in text and "scheduler.max_prefill_tokens: p95/p99 TTFT spikes" in text
    recipe, _ = load_recipe(out)
    assert recipe.name == "stories-fp32-diagnosed"
    assert recipe.scheduler.max_prefill_tokens == 256
    assert recipe.limits == stories.limits and recipe.chat_template == stories.chat_template
    # the model path still points at the parent's model from the overlay's folder
    assert resolve_model_path(recipe, out) == resolve_model_path(stories, load_recipe("stories-fp32")[1])


def test_bad_input(tmp_path: Path, stories) -> None:
    with pytest.raises(BadInput, match="nothing to diagnose"):
        diagnose([], [], stories)
    with pytest.raises(BadInput, match="no such file"):
        diagnose([], [tmp_path / "missing.prom"], stories)
    with pytest.raises(BadInput, match="needs the current recipe"):
        diagnose([], [STORIES_PROM], None, tmp_path / "x.yaml")
    with pytest.raises(BadInput, match="cannot read it"):
        diagnose(["http://127.0.0.1:9/metrics"], [], stories)
    with pytest.raises(BadInput, match="must not have the name"):
        diagnose([], [STORIES_PROM], stories, tmp_path / "stories-fp32.yaml")
    assert not (tmp_path / "stories-fp32.yaml").exists()


def test_real_dynamo_frontend_snapshot(stories) -> None:
    # a real Dynamo 1.6.1 frontend in front of its mocker engine (block size 16, prefix caching), 12 chat requests
    # sharing a system prompt, one after another
    d = diagnose([], [FIXTURES / "dynamo-1.6.1-frontend_mocker.prom"], stories)
    assert d.figures["hit_rate"]["value"] == pytest.approx(1056 / 1491)
    assert d.figures["hit_rate"]["source"].startswith("dynamo_frontend_cached_tokens_sum")
    assert d.figures["max_batch_size"]["value"] == 8
    assert d.figures["requests"]["value"] == 12
    assert "ttft_p50_ms" in d.figures
    assert _row(d, "high TTFT, low utilization").status == "no data"  # the frontend has no queue split


def test_lint_predicts_what_the_dynamo_frontend_reports(stories_engine_dir) -> None:
    # the same 12 requests through `kiln lint-prompts`: the hit tokens equal the frontend's cached_tokens_sum and
    # the prompt tokens its input_sequence_tokens_sum (rendered chat is tokenized without a second BOS, as the
    # frontend does)
    report, _ = lint_prompts(FIXTURES / "dynamo-1.6.1-frontend_mocker.requests.jsonl", stories_engine_dir)
    assert (report.baseline.hit_tokens, report.baseline.prompt_tokens) == (1056, 1491)
    assert report.findings == []


def test_real_run_after_the_overlay() -> None:
    # the engine built from the overlay diagnose wrote for diag-queue (inflight batching, prefix reuse on):
    # TTFT p50 at c=8 fell from 717 ms to 144 ms; now the two slots are busy, so the queueing row asks for more
    recipe, _ = load_recipe(FIXTURES / "diag-queue-tuned.yaml")
    assert recipe.scheduler.batching == "inflight" and recipe.kv_cache.prefix_reuse
    d = diagnose(
        [],
        [
            FIXTURES / "diag-queue-tuned_shared-prefix.prom",
            FIXTURES / "diag-queue-tuned_shared-prefix.bench.json",
        ],
        recipe,
    )
    q = _row(d, "high TTFT, low utilization")
    assert q.status == "yes" and q.changes == {"scheduler.max_batch_size": 4}
    assert _row(d, "high TTFT with long prefill").status == "no"  # 77% of prompt tokens now hit the cache
    cold = _row(d, "cold-start")
    assert cold.status == "yes" and cold.changes == {}  # no warmup prompts: the user must give them
    assert "add your shared system prompt" in cold.next_step


def test_low_speculative_acceptance_says_to_turn_it_off_or_draft_less(tmp_path: Path) -> None:
    recipe = load_recipe("smollm2-ov-bf16-ngram")[0]
    page = STORIES_PROM.read_text() + "".join(
        f'llmkiln_engine{{metric="{name}",model="llmkiln",version="1"}} {value}\n'
        for name, value in (
            ("spec_drafted_tokens", 400),
            ("spec_accepted_tokens", 80),
            ("spec_verifications", 150),
        )
    )
    snap = tmp_path / "spec.prom"
    snap.write_text(page)
    row = _row(diagnose([], [snap], recipe), "speculative drafts mostly rejected")
    assert row.status == "yes"
    assert recipe.speculative is not None
    half = recipe.speculative.max_draft_len // 2  # the recipe's draft length, halved
    assert row.changes == {"speculative.max_draft_len": half, "speculative.max_matching_ngram_size": 4}
    assert any("acceptance = 20%" in f for f in row.figures)
    good = tmp_path / "good.prom"
    good.write_text(
        page.replace(
            '"spec_accepted_tokens",model="llmkiln",version="1"} 80',
            '"spec_accepted_tokens",model="llmkiln",version="1"} 300',
        )
    )
    assert _row(diagnose([], [good], recipe), "speculative drafts mostly rejected").status == "no"
    assert (
        _row(diagnose([], [STORIES_PROM], recipe), "speculative drafts mostly rejected").status == "no data"
    )
    # drafts that rode free (a lone sequence, its runs padded anyway) cost nothing: only the others are judged
    free = tmp_path / "free.prom"
    counters = {"spec_free_drafted_tokens": 400, "spec_free_accepted_tokens": 80}
    free.write_text(
        page + "".join(f'llmkiln_engine{{metric="{k}",model="llmkiln"}} {v}\n' for k, v in counters.items())
    )
    row = _row(diagnose([], [free], recipe), "speculative drafts mostly rejected")
    assert row.status == "no" and any("free rows: a lone padded sequence) = 400" in f for f in row.figures)
    half_free = tmp_path / "half-free.prom"
    counters = {"spec_free_drafted_tokens": 200, "spec_free_accepted_tokens": 70}  # the others: 10 of 200
    half_free.write_text(
        page + "".join(f'llmkiln_engine{{metric="{k}",model="llmkiln"}} {v}\n' for k, v in counters.items())
    )
    row = _row(diagnose([], [half_free], recipe), "speculative drafts mostly rejected")
    assert row.status == "yes" and any("acceptance = 5%" in f for f in row.figures)
