"""The chat TTFT experiment (experiments.chat_ttft) without a server: its sizes, the warmup/level layout of its
workload, and the summary on synthetic reports (side by side, ratios, per-turn TTFT, --resummarize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import chat_ttft
from experiments.chat_ttft import ChatConfig, headline, markdown, summarize, with_warmup_first, write_summary
from llmkiln.bench.report import RunInfo, make_report, save_report
from llmkiln.bench.runner import level_slices, requests_needed
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.bench.workloads import build_workload, load_tokenizer
from llmkiln.errors import BadInput

MS = 1_000_000
STORIES = Path(__file__).resolve().parents[3] / "shared" / "models" / "stories260K"


def report(label, ttfts, cached=0, prompt=800):
    """Levels {c: [ttft ms per request]}, requests alternating turn-1/turn-2, 4 output tokens each."""
    records = {}
    for c, values in ttfts.items():
        recs = []
        for i, t in enumerate(values):
            r = RequestRecord(index=i, group=f"turn-{1 + i % 2}", send_ns=0, num_prompt_tokens=prompt)
            r.token_ns = [(t + 10 * k) * MS for k in range(4)]
            r.end_ns, r.num_output_tokens, r.num_cached_tokens = r.token_ns[-1], 4, cached
            recs.append(r)
        records[c] = recs
    run = RunInfo(
        label=label,
        workload={
            "name": "chat-multiturn",
            "seed": 0,
            "params": {
                "system_tokens": 600,
                "user_tokens": [30, 60],
                "assistant_tokens": 40,
                "num_conversations": 12,
                "num_turns": 4,
                "output_tokens": 32,
            },
        },
        mode="warm",
        warmup_requests=2,
        requests_per_level=len(next(iter(ttfts.values()))),
    )
    return make_report(run, [level_stats(c, recs) for c, recs in records.items()], records)


RUN = {
    "config": {"baseline": "smollm2-baseline", "optimized": "smollm2-fp32", "warmup": 2, "requests": 40},
    "command": "python -m experiments.chat_ttft --out x",
    "date": "2026-01-01T00:00:00+00:00",
    "wall_s": 900.0,
    "machine": {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD/25/1/1", "cores": 2, "loadavg_start": 0.1},
}


def test_summary_side_by_side_and_ratios(tmp_path):
    base = report("smollm2-baseline", {1: [1800] * 40, 8: [4000] * 20 + [6000] * 20}, cached=None)
    opt = report("smollm2-fp32", {1: [400] * 20 + [420] * 20, 8: [1000] * 40}, cached=600)
    s = summarize(RUN, base, opt)
    assert [lv["concurrency"] for lv in s["levels"]] == [1, 8]
    c1, c8 = s["levels"]
    assert c1["baseline"]["ttft_mean_ms"] == pytest.approx(1800)
    assert c1["optimized"]["ttft_mean_ms"] == pytest.approx(410)
    assert c1["ttft_mean_change"] == pytest.approx(410 / 1800 - 1)
    assert c8["ratio"]["mean"] == pytest.approx(0.2) and c8["ratio"]["p50"] == pytest.approx(1000 / 5000)
    assert c1["baseline"]["ttft_p95_ms"] is not None  # 40 samples: p95 quoted
    assert c1["baseline"]["ttft_p99_quotable"] is False  # p99 needs 100
    assert c1["baseline"]["prefix_hit_rate"] is None and c1["optimized"]["prefix_hit_rate"] == pytest.approx(
        0.75
    )
    assert set(c8["baseline"]["ttft_mean_ms_by_turn"]) == {"turn-1", "turn-2"}
    assert headline(c1) == "c=1: mean TTFT 1.80 s → 0.41 s (−77%)"
    md = markdown(s)
    assert "| 1 | 1.80 s → 0.41 s |" in md and "n/a → 75%" in md and "−77%" in md
    assert "¹ p99 of fewer than 100" in md and "AMD EPYC" in md and RUN["command"] in md
    assert "| c | turn-1 | turn-2 |" in md


def test_summary_with_few_samples_and_a_missing_level():
    base = report("smollm2-baseline", {1: [1000] * 4, 4: [2000] * 4})
    opt = report("smollm2-fp32", {1: [500] * 4})
    s = summarize(RUN, base, opt)
    assert [lv["concurrency"] for lv in s["levels"]] == [1]
    lv = s["levels"][0]
    assert lv["baseline"]["ttft_p95_ms"] is None and lv["ratio"]["p95"] is None  # 4 samples: not quoted
    assert "n/a" in markdown(s)


def test_resummarize_rewrites_the_same_summary(tmp_path):
    base = report("smollm2-baseline", {1: [1800] * 40})
    opt = report("smollm2-fp32", {1: [400] * 40})
    save_report(base, tmp_path / "smollm2-baseline.json")
    save_report(opt, tmp_path / "smollm2-fp32.json")
    path, first = write_summary(tmp_path, RUN, base, opt)
    text = path.read_text()
    path.unlink()
    _, again = chat_ttft.resummarize(tmp_path)
    assert again == first == json.loads((tmp_path / "summary.json").read_text())
    assert path.read_text() == text
    with pytest.raises(SystemExit) as exc:
        chat_ttft.main(["--resummarize", "--out", str(tmp_path / "none")])
    assert exc.value.code == 2


def test_config_checks():
    ChatConfig().check()
    for bad in (
        ChatConfig(requests=30),  # below 40
        ChatConfig(requests=50),  # not a multiple of 3 turns
        ChatConfig(levels=(1, 64)),  # more in flight than requests
        ChatConfig(warmup=17),  # more than one round's turn-1 requests (16 conversations)
    ):
        with pytest.raises(BadInput):
            bad.check()
    ChatConfig(quick=True, requests=8, levels=(1, 4), num_turns=2).check()


def test_levels_get_whole_rounds_of_fresh_conversations():
    tok = load_tokenizer(STORIES)
    cfg = ChatConfig(requests=8, levels=(1, 4), num_turns=2, warmup=1, quick=True)
    cfg = ChatConfig(**{**cfg.__dict__, "system_tokens": 64, "user_tokens": (8, 16), "assistant_tokens": 8})
    wl = with_warmup_first(build_workload(tok, cfg.spec(None)), cfg.warmup, cfg.requests)
    assert len(wl.requests) == requests_needed(cfg.requests, cfg.levels, cfg.warmup) == 17
    assert [r.index for r in wl.requests] == list(range(17))
    assert wl.requests[0].group == "turn-1"
    slices = level_slices(wl, cfg.levels, cfg.requests, cfg.warmup)
    for reqs in slices.values():  # 4 conversations x 2 turns, turn by turn
        assert [r.group for r in reqs] == ["turn-1"] * 4 + ["turn-2"] * 4
        for a, b in zip(reqs[:4], reqs[4:], strict=True):
            assert b.prompt.startswith(a.prompt)
    prompts = [r.prompt for r in wl.requests]
    assert len(set(prompts)) == len(prompts)  # nothing repeats across warmup and levels
