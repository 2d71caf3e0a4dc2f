"""Peers run on a real (tiny) engine: onnxruntime-genai og.Engine / og.Generator and transformers."""

from __future__ import annotations

import pytest

from llmkiln.bench.peers import PEERS, ratios, run_peer
from llmkiln.bench.workloads import WorkloadSpec, build_workload, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("peer", PEERS)
def test_peer_runs_the_requests(peer, engine_factory, stories_dir):
    engine = engine_factory("stories-fp32")
    tok = load_tokenizer(engine)
    wl = build_workload(
        tok,
        WorkloadSpec(
            name="shared-prefix", num_requests=3, system_tokens=24, user_tokens=(4, 8), output_tokens=5
        ),
    )
    rep = run_peer(peer, engine, stories_dir, wl, wl.requests, 2)
    lv = rep.levels[0]
    assert rep.run.system == peer and lv.concurrency == 2
    assert lv.num_ok == 3 and lv.num_errors == 0, lv.errors
    assert lv.output_tokens_mean == 5  # greedy, exactly max_tokens (EOS ignored)
    assert lv.ttft_ms.p50 > 0 and lv.tpot_ms.count == 3
    r = ratios(rep, rep, 2)
    assert r["ttft_p50"] == pytest.approx(1.0) and r["output_token_throughput"] == pytest.approx(1.0)
