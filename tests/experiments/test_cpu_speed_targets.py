"""experiments.cpu_speed_targets (the CPU-speed targets over rounds), cpu_peers' --keep, and experiments.engine_ab's
side specs, on synthetic reports: ratios are taken within a round and then averaged; a missing peer is n/a; a kept
summary must have measured the same workload. Nothing is timed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from experiments import cpu_speed_targets as cst
from experiments.cpu_peers import CpuPeersConfig, _kept_systems, summary_config
from experiments.engine_ab import parse_side, round_workloads
from llmkiln.bench.workloads import load_tokenizer
from llmkiln.errors import BadInput


def _report(path: Path, levels: dict[int, tuple[float, float, float, float]]) -> None:
    """A BenchReport-shaped file: per concurrency (tok/s, TTFT p50, TTFT p95, ITL p99)."""
    out = []
    for c, (tps, p50, p95, itl99) in levels.items():
        out.append(
            {
                "concurrency": c,
                "output_token_throughput": tps,
                "ttft_ms": {"p50": p50, "p95": p95},
                "itl_ms": {"p50": itl99 / 3, "p99": itl99},
            }
        )
    path.write_text(json.dumps({"schema": "llmkiln.bench/1", "levels": out}), encoding="utf-8")


def _round(folder: Path, ours: float, vllm: float) -> None:
    folder.mkdir(parents=True)
    _report(folder / "bench-ov-bf16-dynamo.json", {8: (ours, 60, 100, 50)})
    _report(folder / "bench-ov-fp32-dynamo.json", {8: (ours / 2, 120, 200, 90)})
    _report(folder / "vllm-bf16.json", {8: (vllm, 100, 200, 100)})
    _report(folder / "vllm-fp32.json", {8: (vllm / 2, 200, 400, 200)})
    _report(folder / "ovgenai-bf16.json", {8: (ours, 40, 100, 40)})
    _report(folder / "llmkiln-inproc-bf16.json", {8: (ours * 1.1, 40, 90, 40)})
    (folder / "summary.json").write_text("{}", encoding="utf-8")  # not a report: skipped


def test_ratios_are_taken_within_each_round_and_averaged(tmp_path):
    _round(tmp_path / "bench-short" / "round-1", ours=300, vllm=200)  # 1.5x
    _round(tmp_path / "bench-short" / "round-2", ours=100, vllm=100)  # a slow minute for us only: 1.0x
    runs = cst.load(tmp_path)
    assert set(runs) == {"bench-short"} and len(runs["bench-short"]) == 2
    assert set(runs["bench-short"][0]) == {
        "bench-ov-bf16/dynamo",
        "bench-ov-fp32/dynamo",
        "vllm-bf16",
        "vllm-fp32",
        "ovgenai-bf16",
        "llmkiln-inproc-bf16",
    }
    rows = {(r["peer"], r["metric"]): r for r in cst.evaluate(runs)}
    tps = rows[("vllm-bf16", "tok/s")]
    assert tps["rounds"] == pytest.approx([1.5, 1.0]) and tps["value"] == pytest.approx(1.25) and tps["met"]
    assert (
        rows[("vllm-bf16", "TTFT p50")]["value"] == pytest.approx(0.6)
        and rows[("vllm-bf16", "TTFT p50")]["met"]
    )
    genai = rows[("ovgenai-bf16", "TTFT p50")]
    assert genai["value"] == pytest.approx(1.5) and genai["met"] is False
    assert genai["inprocess_value"] == pytest.approx(1.0)  # engine against engine beside it
    md = cst.summary_markdown(runs, cst.evaluate(runs))
    assert "**1.25** (1.50 / 1.00)" in md and "NOT met" in md and "short turns" in md


def test_openvino_genai_served_the_same_way_is_a_peer_of_its_own(tmp_path):
    for k, genai_ttft in ((1, 80.0), (2, 120.0)):
        folder = tmp_path / "bench-short" / f"round-{k}"
        _round(folder, ours=300, vllm=200)
        _report(folder / "bench-ov-bf16-ovgenai-dynamo.json", {8: (250, genai_ttft, 150, 60)})
    runs = cst.load(tmp_path)
    assert "bench-ov-bf16/ovgenai-dynamo" in runs["bench-short"][0]  # not "bench-ov-bf16-ovgenai/dynamo"
    rows = {(r["peer"], r["metric"]): r for r in cst.evaluate(runs)}
    served = rows[("bench-ov-bf16/ovgenai-dynamo", "TTFT p50")]
    assert served["rounds"] == pytest.approx([60 / 80, 60 / 120]) and served["met"] is False  # 0.625 > 0.6
    assert "inprocess_rounds" not in served  # the in-process column belongs to the in-process peer
    assert rows[("bench-ov-bf16/ovgenai-dynamo", "tok/s")]["value"] == pytest.approx(1.2)
    assert rows[("bench-ov-bf16/ovgenai-dynamo", "ITL p99")]["met"] is True  # 50 / 60
    md = cst.summary_markdown(runs, cst.evaluate(runs))
    assert "bench-ov-bf16/dynamo ÷ bench-ov-bf16/ovgenai-dynamo" in md


def test_a_missing_peer_is_not_applicable(tmp_path):
    folder = tmp_path / "smollm2-peers" / "round-1"
    folder.mkdir(parents=True)
    _report(folder / "smollm2-ov-bf16-dynamo.json", {8: (100, 60, 100, 50)})
    rows = cst.evaluate(cst.load(tmp_path))
    assert rows and all(r["met"] is None and r["value"] is None for r in rows)
    assert {r["system"] for r in rows} == {"smollm2-ov-fp32/dynamo", "smollm2-ov-bf16/dynamo"}


def test_int8_weights_are_the_best_precision_where_measured(tmp_path):
    """INT8=1 runs add <bf16 recipe>-int8 served and in-process: the bf16 targets are evaluated for it too."""
    folder = tmp_path / "bench-peers" / "round-1"
    _round(folder, ours=300, vllm=200)
    _report(folder / "bench-ov-bf16-int8-dynamo.json", {8: (330, 54, 90, 45)})
    _report(folder / "llmkiln-inproc-bf16-int8.json", {8: (360, 36, 80, 36)})
    rows = cst.evaluate(cst.load(tmp_path))
    int8 = {(r["peer"], r["metric"]): r for r in rows if r["system"] == "bench-ov-bf16-int8/dynamo"}
    bf16 = [r for r in rows if r["system"] == "bench-ov-bf16/dynamo"]
    assert len(int8) == len(bf16) == 11
    assert int8[("vllm-bf16", "tok/s")]["value"] == pytest.approx(1.65)
    assert (
        int8[("vllm-bf16", "TTFT p50")]["value"] == pytest.approx(0.54)
        and int8[("vllm-bf16", "TTFT p50")]["met"]
    )
    assert int8[("ovgenai-bf16", "tok/s")]["inprocess_value"] == pytest.approx(1.2)  # its own in-process run
    md = cst.summary_markdown(cst.load(tmp_path), rows)
    assert "bench-ov-bf16-int8/dynamo ÷ vllm-bf16" in md


def test_an_empty_folder_says_how_to_measure(tmp_path):
    with pytest.raises(BadInput, match="scripts/cpu_speed_targets.sh"):
        cst.load(tmp_path)


def test_keep_adds_to_a_summary_of_the_same_workload_only(tmp_path):
    cfg = CpuPeersConfig.make(out_dir=tmp_path, concurrency="8,32", requests="64,128", user_tokens="30-40")
    assert _kept_systems(tmp_path, summary_config(cfg)) == {}
    saved = {"config": summary_config(cfg), "systems": {"vllm-bf16": {"levels": {}}}}
    (tmp_path / "summary.json").write_text(json.dumps(saved), encoding="utf-8")
    assert _kept_systems(tmp_path, summary_config(cfg)) == {"vllm-bf16": {"levels": {}}}
    other = CpuPeersConfig.make(out_dir=tmp_path, concurrency="8,32", requests="64,128", user_tokens="80-120")
    with pytest.raises(BadInput, match="user_tokens"):
        _kept_systems(tmp_path, summary_config(other))


def test_engine_ab_sides():
    assert parse_side("") == ({}, ())
    env, sets = parse_side("LLMKILN_CASCADE=0, scheduler.max_num_tokens=512")
    assert env == {"LLMKILN_CASCADE": "0"} and sets == ("scheduler.max_num_tokens=512",)
    with pytest.raises(BadInput, match="NAME=VALUE"):
        parse_side("LLMKILN_CASCADE")


def test_engine_ab_rounds_send_fresh_turns_on_the_same_system_prompt(tmp_path, stories_dir):
    """A round that sent the last round's requests again would find their whole prompts in the prefix store:
    every round gets requests of its own, the levels their counts, the warm-up its own, one system prompt."""
    tok = load_tokenizer(stories_dir)
    sizes = CpuPeersConfig.make(
        out_dir=tmp_path, concurrency="2,4", requests="3,5", warmup=2, user_tokens="30-40"
    )
    wl, warm, rounds = round_workloads(tok, sizes, 3)
    assert len(wl.requests) == 2 + 3 * 8 and len(warm.requests) == 2 and len(rounds) == 3
    seen = [r.index for r in warm.requests]
    for levels in rounds:
        assert {c: len(lv.requests) for c, lv in levels.items()} == {2: 3, 4: 5}
        seen += [r.index for lv in levels.values() for r in lv.requests]
    assert sorted(seen) == sorted(r.index for r in wl.requests) and len(set(seen)) == len(seen)
    prompts = [r.prompt for r in wl.requests]
    assert len(set(prompts)) == len(prompts)  # fresh turns ...
    system = prompts[0][:200]
    assert all(p.startswith(system) for p in prompts)  # ... on one system prompt


ROOT = Path(__file__).resolve().parents[2]


def _bash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_targets_script_refuses_what_it_cannot_measure_before_setting_anything_up(tmp_path):
    """Bad input stops scripts/cpu_speed_targets.sh with exit 2 and a line saying what to do, before the peers'
    venvs are made or anything is measured."""
    r = _bash("scripts/cpu_speed_targets.sh", str(tmp_path / "out"), "gpt2")
    assert r.returncode == 2 and "model gpt2: expected bench or smollm2" in r.stderr
    r = _bash(
        "scripts/cpu_speed_targets.sh",
        str(tmp_path / "out"),
        "bench",
        env={"INT8": "1", "ENGINES": str(tmp_path)},
    )
    assert r.returncode == 2 and f"kiln build bench-ov-bf16-int8 --engines-dir {tmp_path}" in r.stderr
    assert not (tmp_path / "out").exists()


def test_served_arms_refuses_a_setting_it_does_not_know(tmp_path):
    r = _bash("bench/results/served_arms.sh", str(tmp_path / "out"), "1", "bench-ov-bf16", "a:checkout")
    assert r.returncode == 2 and "setting 'checkout' is neither VAR=VALUE nor checkout=DIR" in r.stderr
