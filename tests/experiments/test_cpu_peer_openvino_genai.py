"""The OpenVINO GenAI peer (experiments.cpu_peer_openvino_genai + its worker) without openvino-genai: the pipeline
settings it builds, the closed loop on a stand-in pipeline, the raw records -> BenchReport loader, the requests it
sends (the harness's prompts, encoded as the server does), and exit 2 naming scripts/openvino_genai_env.sh when the
venv is missing. Nothing is timed."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments import cpu_peer_openvino_genai as peer
from experiments import cpu_peer_openvino_genai_worker as worker
from experiments.cpu_peers import CpuPeersConfig
from experiments.cpu_peers_summary import metric
from llmkiln.bench.report import BenchReport
from llmkiln.bench.workloads import load_tokenizer
from llmkiln.errors import BadInput

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------------------
# The pipeline's settings


class FakeSchedulerConfig:
    def to_string(self) -> str:
        return "SchedulerConfig {}"


def test_scheduler_config_and_properties_are_the_bench_recipes_settings():
    s = worker.PipelineSettings()
    sc = worker.scheduler_config(SimpleNamespace(SchedulerConfig=FakeSchedulerConfig), s)
    assert (sc.enable_prefix_caching, sc.dynamic_split_fuse) == (True, True)
    assert (sc.max_num_seqs, sc.max_num_batched_tokens, sc.cache_size) == (8, 1024, 4)
    assert s.properties("fp32") == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "INFERENCE_NUM_THREADS": 2,
    }
    assert s.properties("bf16")["INFERENCE_PRECISION_HINT"] == "bf16"
    assert s.properties("bf16")["KV_CACHE_PRECISION"] == "bf16"  # not the CPU plugin's u8 default
    with pytest.raises(ValueError, match="precision"):
        s.properties("int8")
    assert worker.PipelineSettings.from_dict(asdict(s)) == s
    with pytest.raises(ValueError, match="unknown"):
        worker.PipelineSettings.from_dict({"max_batch": 3})


def test_config_options_reach_the_settings_and_the_levels():
    cfg = peer.PeerConfig.make(settings={"threads": 1, "max_num_batched_tokens": 512, "cache_size_gb": 2})
    assert (cfg.settings.threads, cfg.settings.max_num_batched_tokens, cfg.settings.cache_size_gb) == (
        1,
        512,
        2,
    )
    assert (cfg.levels, cfg.requests, cfg.warmup, cfg.precisions) == (
        (1, 4, 8),
        (24, 32, 64),
        8,
        ("fp32", "bf16"),
    )
    spec = cfg.spec()
    assert (spec.system_tokens, spec.user_tokens, spec.output_tokens) == (1500, (80, 120), 32)
    assert spec.num_requests == 8 + 24 + 32 + 64
    for kw in ({}, {"quick": True}, {"requests": "20,30,40", "warmup": 3, "concurrency": "1,4,8"}):
        ours = peer.PeerConfig.make(**kw)
        theirs = CpuPeersConfig.make(**kw)  # the served harness: the same requests for the same arguments
        assert (
            ours.spec() == theirs.spec() and ours.requests == theirs.requests and ours.warmup == theirs.warmup
        )
        assert (ours.out_dir, ours.raw_dir) == (theirs.out_dir, theirs.raw_dir)
    quick = peer.PeerConfig.make(quick=True, precisions="bf16", out_dir=Path("x"))
    assert quick.precisions == ("bf16",) and quick.raw_dir == Path("x/raw") and quick.requests == (4, 4, 8)
    for bad in ({"precisions": "fp16"}, {"requests": "2,2"}, {"requests": "1,1,1"}, {"warmup": 0}):
        with pytest.raises(BadInput):
            peer.PeerConfig.make(**bad)


# ---------------------------------------------------------------------------------------------------------------
# The closed loop on a stand-in pipeline


class FakeHandle:
    def __init__(self, max_tokens: int, status: str = "RUNNING") -> None:
        self.left, self.pending, self.status = max_tokens, [], status

    def can_read(self) -> bool:
        return bool(self.pending)

    def read(self) -> dict[int, SimpleNamespace]:
        out, self.pending = self.pending, []
        return {0: SimpleNamespace(generated_ids=out)}

    def get_status(self) -> SimpleNamespace:
        return SimpleNamespace(name=self.status)


class FakePipeline:
    """Each step gives every live request one token (a request with `fail` ids is dropped: status IGNORED)."""

    def __init__(self) -> None:
        self.handles: dict[int, FakeHandle] = {}
        self.max_live = 0

    def add_request(self, rid, ids, cfg):
        if ids == "refuse":
            raise RuntimeError("prompt too long")
        h = FakeHandle(cfg, "IGNORED" if ids == "fail" else "RUNNING")
        self.handles[rid] = h
        return h

    def step(self) -> None:
        live = [h for h in self.handles.values() if h.status == "RUNNING"]
        self.max_live = max(self.max_live, len(live))
        for h in live:
            h.pending.append(7)
            h.left -= 1
            if h.left == 0:
                h.status = "FINISHED"

    def has_non_finished_requests(self) -> bool:
        return any(h.status == "RUNNING" for h in self.handles.values())


def reqs(n: int, max_tokens: int = 3) -> list[worker.PeerRequest]:
    return [worker.PeerRequest(i, "shared", (1, 5 + i), max_tokens, 10 + i) for i in range(n)]


def run_loop(requests, concurrency, make_input=lambda r: r.ids):
    clock = itertools.count(1000, 10).__next__  # a fake clock: every reading 10 ns later
    pipe = FakePipeline()
    recs, stats = worker.closed_loop(
        pipe, requests, concurrency, make_input, lambda r: r.max_tokens, first_id=5, clock=clock
    )
    return pipe, recs, stats


def test_closed_loop_keeps_concurrency_requests_in_flight_and_records_every_token():
    pipe, recs, stats = run_loop(reqs(7), 3)
    assert pipe.max_live == 3
    assert [r["index"] for r in recs] == list(range(7))
    assert all(r["error"] is None and r["num_output_tokens"] == 3 == len(r["token_ns"]) for r in recs)
    assert all(r["output_ids"] == [7, 7, 7] for r in recs)
    assert all(r["send_ns"] < r["token_ns"][0] <= r["token_ns"][-1] == r["end_ns"] for r in recs)
    ends = sorted(r["end_ns"] for r in recs)
    for r in recs[3:]:  # closed loop: each later request is sent when an earlier one has ended
        assert any(e <= r["send_ns"] for e in ends)
    assert stats["next_id"] == 5 + 7 and stats["steps"] >= 7 and stats["live_mean"] <= 3


def test_closed_loop_reports_refused_and_dropped_requests():
    def make_input(r):
        return {0: "refuse", 1: "fail"}.get(r.index, r.ids)

    _, recs, _ = run_loop(reqs(4), 2, make_input)
    assert "prompt too long" in recs[0]["error"]
    assert "IGNORED" in recs[1]["error"]
    assert [r["error"] for r in recs[2:]] == [None, None]


# ---------------------------------------------------------------------------------------------------------------
# Raw records -> BenchReport


def raw_doc(precision="fp32") -> dict:
    levels = {}
    for c, n in ((1, 2), (4, 5)):
        _, recs, stats = run_loop(reqs(n, max_tokens=4), c)
        levels[str(c)] = {"records": recs, **stats, "max_cache_usage": 1.5}
    return {
        "schema": worker.SCHEMA,
        "precision": precision,
        "settings": asdict(worker.PipelineSettings()),
        "properties": worker.PipelineSettings().properties(precision),
        "compiled": {"KV_CACHE_PRECISION": "f32"},
        "workload": {"name": "shared-prefix", "seed": 0, "params": {"system_tokens": 1500}},
        "warmup_requests": 2,
        "ids_sha256": {"1": "ab"},
        "levels": levels,
    }


def test_the_raw_records_become_a_bench_report(tmp_path):
    report, records = peer.report_from_raw(raw_doc("bf16"))
    assert isinstance(report, BenchReport)
    assert report.run.label == "ovgenai-bf16" and report.run.system == "openvino-genai"
    assert (
        report.run.mode == "warm" and report.run.warmup_requests == 2 and report.run.requests_per_level == 5
    )
    assert [lv.concurrency for lv in report.levels] == [1, 4]
    lv = report.level(4)
    assert lv is not None and lv.num_ok == 5 and lv.num_errors == 0 and lv.output_tokens_mean == 4
    assert lv.ttft_ms.count == 5 and lv.itl_ms.count == 5 * 3 and lv.output_token_throughput > 0
    assert report.run.extra["steps"]["4"]["max_cache_usage"] == 1.5
    assert report.run.extra["ids_sha256"] == {"1": "ab"}
    assert len(records[4]) == 5 and not hasattr(records[4][0], "output_ids")
    # the loader the summary uses, from the worker's file; and the report file round-trips
    raw = tmp_path / "ovgenai-bf16.raw.json"
    raw.write_text(json.dumps(raw_doc("bf16")))
    loaded = peer.load_peer_report(raw)
    assert loaded.level(1) is not None and loaded.level(1).num_ok == 2
    BenchReport.model_validate_json(loaded.model_dump_json(by_alias=True))
    with pytest.raises(BadInput, match="not an OpenVINO GenAI"):
        peer.report_from_raw({"schema": "x"})
    with pytest.raises(BadInput, match="no such file"):
        peer.load_peer_report(tmp_path / "missing.json")


def test_a_summary_entry_in_cpu_peers_shape():
    raw = raw_doc("bf16")
    raw.update(load_s=0.5, engine_dir="/e", loadavg_before=[0.1], loadavg_after=[0.2])
    name, entry = peer.summary_entry(raw)
    assert name == "ovgenai-bf16" and entry["kind"] == "openvino-genai" and entry["precision"] == "bf16"
    assert set(entry["levels"]) == {"1", "4"} and entry["levels"]["4"]["requests"] == 5
    summary = {"systems": {name: entry}}
    assert metric(summary, name, 4, "output_tok_s")[0] == entry["levels"]["4"]["output_tok_s"] > 0
    assert metric(summary, name, 4, "ttft_p50")[0] == entry["levels"]["4"]["ttft_ms"]["p50"]


def test_report_only_rewrites_the_reports_from_raw(tmp_path):
    cfg = peer.PeerConfig.make(out_dir=tmp_path, precisions="fp32")
    cfg.raw_dir.mkdir(parents=True)
    (cfg.raw_dir / "ovgenai-fp32.raw.json").write_text(json.dumps(raw_doc()))
    assert run(["--report-only", "--out", str(tmp_path), "--precisions", "fp32"]) == 0
    report = BenchReport.model_validate_json((tmp_path / "ovgenai-fp32.json").read_text())
    assert report.level(4) is not None
    assert len((cfg.raw_dir / "ovgenai-fp32.jsonl").read_text().splitlines()) == 2 + 5


# ---------------------------------------------------------------------------------------------------------------
# The requests: the harness's prompts, encoded as the server does


def test_requests_are_the_harness_split_encoded_with_bos(stories_dir):
    tok = load_tokenizer(stories_dir)
    cfg = peer.PeerConfig.make(quick=True)
    doc = peer.requests_doc(cfg, tok)
    from llmkiln.bench.workloads import build_workload

    wl = build_workload(tok, cfg.spec())
    assert len(doc["warmup"]) == 2 and [len(doc["levels"][str(c)]) for c in (1, 4, 8)] == [4, 4, 8]
    flat = doc["warmup"] + [r for c in (1, 4, 8) for r in doc["levels"][str(c)]]
    assert [r["index"] for r in flat] == [r.index for r in wl.requests]  # consecutive slices, in order
    for r, req in zip(flat, wl.requests, strict=True):
        assert r["ids"] == tok.encode(req.prompt, add_special_tokens=True).ids
        assert r["max_tokens"] == 8 and r["num_prompt_tokens"] == req.num_prompt_tokens
    assert set(doc["ids_sha256"]) == {"warmup", "1", "4", "8"}
    assert doc["workload"]["params"]["system_tokens"] == 512
    assert peer.requests_doc(cfg, tok) == doc  # seeded: the same prompts every time
    assert all(worker.PeerRequest.from_dict(r).ids == tuple(r["ids"]) for r in flat)


# ---------------------------------------------------------------------------------------------------------------
# Without the venv


def run(argv):
    with pytest.raises(SystemExit) as exc:
        peer.main(argv)
    return exc.value.code


def test_a_missing_venv_stops_the_run_with_exit_2_naming_the_script(tmp_path, capsys):
    args = ["--venv", str(tmp_path / "nope"), "--engine", str(tmp_path / "no-engine"), "--out", str(tmp_path)]
    assert run(args) == 2
    err = capsys.readouterr().err
    assert "scripts/openvino_genai_env.sh" in err and "nope" in err
    assert run([*args, "--check"]) == 2
    assert "scripts/openvino_genai_env.sh" in capsys.readouterr().err
    half = tmp_path / "half"  # a venv whose install did not finish (no stamp)
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(BadInput, match="openvino_genai_env.sh"):
        peer.find_venv(half)
    assert not list(tmp_path.glob("*.json"))  # nothing measured or written


def test_the_worker_without_openvino_genai_exits_2_naming_the_script(tmp_path):
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("openvino_genai is importable here")
    (tmp_path / "r.json").write_text(json.dumps({"warmup": [], "levels": {}}))
    out = subprocess.run(
        [
            sys.executable,
            str(peer.WORKER),
            "bench",
            str(tmp_path),
            str(tmp_path / "r.json"),
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 2, out.stderr
    assert "scripts/openvino_genai_env.sh" in out.stderr


def test_compiled_properties_are_parsed_from_openvinos_log():
    text = "Model: OV Tokenizer\n  KV_CACHE_PRECISION: u8\nModel: LLM with Paged Attention\n"
    text += "  INFERENCE_PRECISION_HINT: bf16\n  KV_CACHE_PRECISION: bf16\nEXECUTION_DEVICES:\n CPU: x\n"
    props = worker.parse_compiled_properties(text)
    assert props["LLM with Paged Attention"] == {
        "INFERENCE_PRECISION_HINT": "bf16",
        "KV_CACHE_PRECISION": "bf16",
    }
    assert props["OV Tokenizer"] == {"KV_CACHE_PRECISION": "u8"}
