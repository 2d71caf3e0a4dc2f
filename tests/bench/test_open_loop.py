"""Open-loop arrivals, goodput under an SLO, prefix hit rate, K system prompts, the OpenAI request body."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from llmkiln.bench.arrivals import closed_loop, open_loop, poisson_offsets
from llmkiln.bench.openai_client import check_openai_url, request_body
from llmkiln.bench.report import BenchReport, markdown_report
from llmkiln.bench.stats import RequestRecord, Slo, goodput, level_stats, prefix_hit_rate
from llmkiln.bench.workloads import BenchRequest, WorkloadSpec, build_workload
from llmkiln.errors import BadInput

from .test_stats import rec


def test_poisson_offsets_are_seeded_and_have_the_rate():
    a, b = poisson_offsets(2000, 4.0, seed=1), poisson_offsets(2000, 4.0, seed=1)
    assert a == b and a != poisson_offsets(2000, 4.0, seed=2)
    gaps = [y - x for x, y in zip([0.0, *a], a, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.1)
    assert all(g > 0 for g in gaps)
    with pytest.raises(BadInput, match="--request-rate"):
        poisson_offsets(3, 0.0, 0)


def _requests(n: int) -> list[BenchRequest]:
    return [BenchRequest(i, f"p{i}", 4, 10, "g") for i in range(n)]


def test_open_loop_does_not_wait_for_earlier_requests():
    """Requests of 0.3 s at 50/s: the open loop has many in flight at once; the closed loop at 1 never does."""
    in_flight = {"now": 0, "max": 0}

    async def send(req: BenchRequest) -> RequestRecord:
        r = RequestRecord(index=req.index, group=req.group, send_ns=time.perf_counter_ns())
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.3)
        in_flight["now"] -= 1
        r.token_ns, r.end_ns, r.num_output_tokens = [time.perf_counter_ns()], time.perf_counter_ns(), 1
        return r

    records = asyncio.run(open_loop(send, _requests(10), rate=50.0, seed=0))
    assert [r.index for r in records] == list(range(10)) and in_flight["max"] >= 5
    in_flight["max"] = 0
    asyncio.run(closed_loop(send, _requests(3), 1))
    assert in_flight["max"] == 1


def test_goodput_counts_requests_meeting_both_objectives():
    recs = [
        rec(0, 0, [100, 110, 120], 121),  # ttft 100, tpot 10: good
        rec(1, 0, [900, 1100, 1300], 1301),  # ttft 900, tpot 200: TPOT misses
        rec(2, 0, [1500, 1510], 1511),  # ttft 1500: TTFT misses
        rec(3, 0, [50], 51),  # one token, no TPOT: good
        rec(4, 0, [], None, error="boom"),  # failed: never good
    ]
    g = goodput(recs, Slo(ttft_ms=1000, tpot_ms=100), duration_s=2.0)
    assert g.good_requests == 2 and g.goodput_rps == 1.0 and g.attainment == pytest.approx(0.4)
    assert not g.ttft_p95_met and not g.tpot_p95_met
    lv = level_stats(8, recs, Slo(), request_rate=2.0)
    assert lv.request_rate == 2.0 and lv.goodput is not None and lv.goodput.good_requests == 2


def test_prefix_hit_rate_uses_the_servers_prompt_count():
    a, b = rec(0, 0, [1], 2, cached=64), rec(1, 0, [1], 2, cached=0)
    a.server["prompt_tokens"], b.server["prompt_tokens"] = 100, 60
    assert prefix_hit_rate([a, b]) == pytest.approx(64 / 160)
    assert prefix_hit_rate([rec(2, 0, [1], 2)]) is None  # the server reported no cache


def test_k_system_prompts_are_drawn_at_random_and_split_for_chat():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *_vocab()])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    spec = WorkloadSpec(num_requests=24, system_tokens=40, user_tokens=(5, 8), num_system_prompts=4, seed=3)
    wl = build_workload(tok, spec)
    groups = [r.group for r in wl.requests]
    assert set(groups) == {f"system-{k}" for k in range(4)}
    assert groups[:8] != ["system-0", "system-1", "system-2", "system-3"] * 2  # not a cycle
    for r in wl.requests:
        system, user = r.split_system()
        assert system + user == r.prompt and user.startswith("User ")
        assert len(tok.encode(system).ids) == 40
    body = request_body("m", wl.requests[0], "chat")
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0
    assert request_body("m", wl.requests[0], "completions")["prompt"] == wl.requests[0].prompt


def _vocab() -> list[str]:
    from llmkiln.bench.workloads import _FILLERS, _WORDS

    words = set(_WORDS) | {f.strip() for f in _FILLERS} | {"System:", "System", "you", "User"}
    words |= {f"{i}:" for i in range(100)} | {"1:", "2:", "3:"}
    head = "System: you are a careful assistant for a pottery workshop. Follow these notes."
    words |= set(head.split())
    return sorted(w for w in words if w)


def test_openai_urls_must_be_loopback():
    assert check_openai_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert check_openai_url("http://localhost:9/v1") == "http://localhost:9/v1"
    for bad in ("http://10.0.0.1:8000/v1", "127.0.0.1:8000", "ftp://127.0.0.1/v1"):
        with pytest.raises(BadInput):
            check_openai_url(bad)


def test_old_reports_still_load_and_new_columns_render(report_factory):
    report = report_factory("a", {4: [100, 200, 300]})
    data = report.model_dump(by_alias=True)
    for lv in data["levels"]:  # a report written before these fields existed
        for key in ("prefix_hit_rate", "request_rate", "goodput"):
            lv.pop(key)
    data["run"].pop("api")
    old = BenchReport.model_validate(data)
    assert old.levels[0].goodput is None and old.run.api == "triton"
    assert "goodput" in markdown_report(old)


def test_an_error_event_in_the_stream_is_recorded_with_its_message():
    """A server that validates after the stream began (Dynamo's frontend: 200, then an error event) gets its
    message into the record, not "no finish_reason"."""
    import httpx

    from llmkiln.bench.openai_client import run_one

    body = (
        'data: {"error":{"message":"prompt has 4801 tokens; limits.max_input_len is 384: shorten the prompt",'
        '"type":"invalid_request_error","code":400}}\n\ndata: [DONE]\n\n'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_one(
                client,
                "http://127.0.0.1:8000/v1",
                "m",
                BenchRequest(0, "x", 4801, 8, "g"),
                "completions",
                5.0,
            )

    rec = asyncio.run(go())
    assert not rec.ok and rec.error is not None
    assert (
        rec.error.startswith("HTTP 400 in the stream: prompt has 4801 tokens")
        and "max_input_len" in rec.error
    )
