"""The step profile end to end: `kiln profile` serves stories-fp32 with $LLMKILN_PROFILE and aggregates it."""

from __future__ import annotations

import pytest

from llmkiln.bench.profile import HOPS, PHASES
from llmkiln.bench.report import load_report
from llmkiln.cli.main import main

pytestmark = pytest.mark.slow


def test_kiln_profile_reports_phases_and_ttft_hops(engine_factory, stories_dir, tmp_path):
    engine = engine_factory("stories-fp32")
    out, md, raw = tmp_path / "p.json", tmp_path / "p.md", tmp_path / "raw.jsonl"
    argv = ["profile", str(engine), "--concurrency", "1,3", "--requests", "4", "--warmup-requests", "1"]
    argv += [
        "--system-tokens",
        "64",
        "--user-tokens",
        "8-16",
        "--output-tokens",
        "6",
        "--set",
        "scheduler.ttft_first=true",
    ]
    argv += ["--out", str(out), "--markdown", str(md), "--raw-profile", str(raw)]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    rep = load_report(out)
    assert rep.run.extra["overrides"] == {"scheduler": {"ttft_first": True}}
    assert set(rep.profile) == {"1", "3"}
    for c, prof in rep.profile.items():
        lv = rep.level(int(c))
        assert lv is not None and lv.num_ok == 4
        # every request's prompt was prefilled (a run may carry several prompts: at c=3 on a busy machine
        # three arrive together), at least its last token; the cached 64-token system prompt is not recomputed.
        # No floor of 8 user tokens a request: each level replays the same seeded prompts, so at c=3 a user
        # part that fills a whole KV block is a prefix-cache hit too (seen in CI: 27 tokens for 4 requests)
        assert prof.steps > 0 and prof.prefill.runs >= 1 and prof.decode.tokens > 0
        assert prof.prefill.rows >= 4 and 4 <= prof.prefill.tokens <= 4 * 16
        # structure only: the phases are there and non-negative (their sum against the wall clock is a timing)
        ph = prof.phases
        assert set(ph.ms) == set(PHASES) and set(ph.share) == {*PHASES, "idle"}
        assert all(v >= 0 for v in ph.ms.values()) and ph.busy_ms >= 0 and ph.idle_ms >= 0 and ph.wall_ms > 0
        hops = prof.hops_ms
        assert set(hops) == {name for name, _ in HOPS} and all(hops[name].count == 4 for name in hops)
        # the hops partition the client's TTFT (one wall clock, stamps in order)
        assert all(hops[name].min >= -1.0 for name in hops)  # ms; one wall clock, stamps in order
        total = sum(hops[name].mean for name in hops)
        assert total == pytest.approx(prof.ttft_ms.mean, rel=0.02, abs=1.0)
    assert rep.level(3).cached_tokens_mean >= 64  # the system prompt came from the prefix cache
    text = md.read_text()
    assert "| decode |" in text and "client TTFT" in text
    assert raw.read_text().count('"kind":"serve"') >= 1 + 4 + 4  # + the recipe warmup
