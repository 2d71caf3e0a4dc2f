"""experiments.spec_decode and its rounds, run small (llmkiln's two systems; GenAI needs its own venv): the
harness of bench/results/spec-decode keeps working — a script nothing runs rots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.spec_decode_rounds import main as rounds_main

pytestmark = pytest.mark.slow


def test_two_small_rounds_write_the_tables_and_count_the_drafts(tmp_path: Path, engine_factory) -> None:
    engine = engine_factory("smollm2-ov-fp32")
    out = tmp_path / "spec"
    with pytest.raises(SystemExit) as done:
        rounds_main(
            [
                "--out", str(out), "--rounds", "2", "--systems", "llmkiln-plain,llmkiln-ngram", "--",
                "--engine", str(engine), "--concurrency", "1", "--requests", "2", "--warmup", "1",
                "--max-tokens", "24", "--workloads", "grounded",
            ]
        )  # fmt: skip
    assert done.value.code in (0, None)
    summary = (out / "SUMMARY.md").read_text()
    assert "## grounded" in summary and "ngram / plain" in summary
    for k in (1, 2):
        data = json.loads((out / f"round-{k}" / "summary.json").read_text())
        spec = data["results"]["grounded"]["llmkiln-ngram"]["1"]["spec"]
        assert spec["drafted"] > 0 and spec["accepted"] is not None
        # fp32: the drafts change no token
        check = data["correctness"]["grounded"]["llmkiln-ngram vs llmkiln-plain"]["1"]
        assert check["identical"] == check["compared"] == 2


def test_the_stepped_and_the_async_loop_give_the_same_greedy_outputs(engine_factory) -> None:
    """--harness stepped (GenAI's loop: this thread steps the engine) and async (the engine's thread) run the same
    requests to the same tokens, every token stamped, at most `concurrency` in flight."""
    import asyncio

    from experiments.spec_decode import closed_loop, stepped_loop
    from llmkiln.bench.workloads import BenchRequest
    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.loader import load_engine

    eng = load_engine(EngineDir(engine_factory("stories-ov-fp32")))
    reqs = [BenchRequest(i, "x", 4, 6 + i, "grounded") for i in range(5)]
    ids = {i: [1, 5 + i, 9, 13 + 2 * i] for i in range(5)}
    stepped, stepped_out = stepped_loop(eng, reqs, ids, 2)
    eng.start()
    try:
        threaded, threaded_out = asyncio.run(closed_loop(eng, reqs, ids, 2))
    finally:
        eng.shutdown(5.0)
    assert stepped_out == threaded_out and len(stepped_out) == 5
    for rec in stepped:
        assert rec.ok and rec.num_output_tokens == len(stepped_out[rec.index]) == len(rec.token_ns) > 0
    assert [r.index for r in stepped] == [r.index for r in threaded] == list(range(5))
