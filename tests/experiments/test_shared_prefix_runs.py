"""experiments.shared_prefix_runs, the set-up of the one-run-at-a-time probes (bench/results/*/…_probe.py): a
1504-token past written once, decoders with tokens of their own after it, a turn's table; runs on them give logits
on both graphs (the head-64 smoke model, so the cascade graph runs where the CPU has AVX512-BF16)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.shared_prefix_runs import PAST, median_run_ms, prefix_with_decoders, token_ids
from tests.conftest import requires_bf16
from tests.runtime.test_cascade_attention import RECIPE


def test_the_past_and_the_decoders_are_written_and_runs_on_them_agree(engine_factory, tmp_path):
    recipe = tmp_path / "cascade-test-ov-fp32.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    r, tables, turn = prefix_with_decoders(engine_factory(str(recipe)), 3, 40)
    try:
        shared = PAST // r.block_size
        assert len(tables) == 3 and all(t[:shared] == tuple(range(shared)) for t in tables)
        assert (
            len({b for t in tables for b in t[shared:]} | set(turn[shared:])) == 3 * 3 + 8
        )  # nothing reused
        assert max(max(t) for t in [*tables, turn]) < r.num_blocks
        plan = [(f"s{i}", (5 + i,), PAST + 40, tables[i]) for i in range(3)]
        plan.append(("t", token_ids(r, 400, 35), PAST, turn))
        paged = r._run(plan, [1] * len(plan), cascade=False)
        assert paged.shape == (4, r.vocab_size) and np.isfinite(paged).all()
        if r.cascade_req is not None:
            cascade = r._run(plan, [1] * len(plan), cascade=True)
            assert np.abs(cascade - paged).max() <= 1e-4 * max(1.0, np.abs(paged).max())
    finally:
        r.close()


def test_without_the_cascade_graph_the_same_set_up_times_paged_attention_runs(engine_factory, tmp_path):
    """`cascade=False`: a runner without the cascade graph (as the u8 KV probe needs), and median_run_ms runs the
    plan on PagedAttention's graph (asking for the cascade graph there raises)."""
    recipe = tmp_path / "cascade-test-ov-fp32.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    r, tables, _ = prefix_with_decoders(engine_factory(str(recipe)), 2, 40, cascade=False)
    try:
        assert r.cascade_req is None
        plan = [(f"s{i}", (5 + i,), PAST + 40, tables[i]) for i in range(2)]
        assert median_run_ms(r, plan, runs=2, warm=1, cascade=False) > 0
        with pytest.raises(ValueError, match="no cascade attention graph"):
            median_run_ms(r, plan, runs=1, warm=0)
    finally:
        r.close()


@requires_bf16
def test_the_runner_computes_in_the_precision_asked_for(engine_factory, tmp_path):
    """`precision`: the compute and KV pools' precision instead of the recipe's (a step probe of one engine's IR in
    another precision), and the runs on it give logits."""
    recipe = tmp_path / "cascade-test-ov-fp32.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    r, tables, _ = prefix_with_decoders(engine_factory(str(recipe)), 2, 40, precision="bf16")
    try:
        assert r.settings.precision == "bf16"
        plan = [(f"s{i}", (5 + i,), PAST + 40, tables[i]) for i in range(2)]
        assert np.isfinite(r._run(plan, [1, 1], cascade=False)).all()
    finally:
        r.close()
