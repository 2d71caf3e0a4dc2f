"""scripts/gpu_verify.sh's probe (llmkiln.trtllm.smoke), run here against llmkiln's CPU model in a real
tritonserver: same generate_stream protocol and perf output names as the tensorrtllm ensemble. It must see the
warmup prefix primed before READY, KV reuse on the second request of a shared prefix, and write the results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from llmkiln.recipe import Warmup
from llmkiln.serve.repository import spec_from_engine, write_repository
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports
from llmkiln.trtllm.smoke import probe

pytestmark = pytest.mark.slow

PREFIX = (
    "You are a friendly storyteller. You tell short, happy stories about animals, children and their toys. "
    "Every story has a beginning, a middle and an end.\n"
)


@pytest.fixture(scope="module")
def served(engine_factory, tmp_path_factory: pytest.TempPathFactory):
    engine = engine_factory("stories-fp32")
    tmp = tmp_path_factory.mktemp("smoke")
    spec = spec_from_engine(engine)
    spec.warmup = Warmup(prefixes=[PREFIX], prompts=["Once upon a time"], count=1, max_tokens=4)
    write_repository(spec, tmp / "repo")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(ServerConfig(tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                                       exit_timeout_s=20, workdir=tmp))  # fmt: skip
    server.start()
    server.wait_ready(300)
    yield server
    server.stop()


def test_probe_sees_warmup_priming_and_reuse(served: TritonServer) -> None:
    result = probe(f"http://{served.url_http}", "cpu", PREFIX, rounds=2, max_tokens=4)
    assert result["problems"] == []
    assert result["primed_by_warmup"]["reused_blocks"] > 0
    assert all(s["reused_blocks"] > 0 for s in result["warm"])
    assert all(s["reused_blocks"] == 0 for s in result["cold"])
    assert result["cold_ttft_median_s"] > 0 and result["warm_ttft_median_s"] > 0


def test_probe_reports_an_unprimed_prefix(served: TritonServer) -> None:
    result = probe(
        f"http://{served.url_http}", "cpu", "A prefix no warmup has seen. " * 6, rounds=1, max_tokens=2
    )
    assert result["problems"] == [
        "the first request with the warmup prefix reused no KV blocks: warmup did not prime the cache before READY"
    ]


def test_the_module_entry_point_writes_results(served: TritonServer, tmp_path: Path) -> None:
    import subprocess

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "smoke-cpu.yaml").write_text(
        f"name: smoke-cpu\nextends: stories-fp32\nwarmup:\n  prefixes: [{json.dumps(PREFIX)}]\n  max_tokens: 4\n"
    )
    r = subprocess.run([sys.executable, "-m", "llmkiln.trtllm.smoke", "probe", "--url", f"http://{served.url_http}", "--kind",
                        "cpu", "--recipe", str(recipes / "smoke-cpu.yaml"), "--rounds", "1", "--out",
                        str(tmp_path / "results")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (written,) = (tmp_path / "results").glob("*-smoke-cpu.json")
    data = json.loads(written.read_text())
    assert data["machine"]["pins"]["tensorrt_llm"] == "1.2.1" and data["warm"][0]["reused_blocks"] > 0
