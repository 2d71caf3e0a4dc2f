"""The llama.cpp peer (llmkiln.bench.llama_cpp_peer + experiments.cpu_peer_llama_cpp) without llama-cpp-python: the
server's argv and environment, the venv lookup (exit 2 naming scripts/llama_cpp_env.sh), the tokenization check,
the run's sizes (cpu_peers' workload; --quick one level) and its summary entries — end to end against a stand-in
OpenAI server on loopback that answers like llama-cpp-python's (text completions streamed one token per chunk, no
usage, /extras/tokenize). Nothing is timed."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from experiments import cpu_peer_llama_cpp as exp
from experiments.cpu_peers import CpuPeersConfig
from experiments.cpu_peers_summary import FRONT_DOORS, metric
from llmkiln.bench import llama_cpp_peer as peer
from llmkiln.bench.peer_server import check_tokenization, require_same_tokens
from llmkiln.bench.report import load_report
from llmkiln.bench.workloads import _WORDS
from llmkiln.errors import BadInput, KilnError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """A small byte-level BPE trained on the workload's words (no BOS: like SmolLM2's tokenizer.json)."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    text = " ".join(_WORDS)
    t.train_from_iterator(
        [text, text.upper(), "System: you are a careful assistant. User 1: a, the. I it to"], trainer
    )
    return t


@pytest.fixture
def model_dir(tmp_path, tok) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    (d / "config.json").write_text("{}")
    return d


@pytest.fixture
def ggufs(tmp_path) -> list[str]:
    out = []
    for name in ("q4_1", "f16"):
        p = tmp_path / f"model.{name}.gguf"
        p.write_bytes(b"GGUF" + name.encode())
        out.append(f"{name}={p}")
    return out


def fake_venv(root: Path, stamp: bool = True) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    (venv / "lib" / "python3.11" / "site-packages" / f"llama_cpp_python-{peer.VERSION}.dist-info").mkdir(
        parents=True
    )
    if stamp:
        (venv / peer.VENV_STAMP).write_text("done\n")
    return venv


# ---------------------------------------------------------------------------------------------------------------
# The server's command line and environment


def test_the_command_is_the_documented_server_with_its_concurrency_settings(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    opts = peer.LlamaCppOptions(gguf=gguf, served_model_name="smol", port=8123)
    argv = peer.llama_cpp_command(Path("/v/bin/python"), opts)
    assert argv[:4] == ["/v/bin/python", "-P", "-m", "llama_cpp.server"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert flags == {
        "--model": str(gguf),
        "--model_alias": "smol",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_threads": "2",
        "--n_threads_batch": "2",
        "--n_ctx": "8192",
        "--n_batch": "512",
        "--n_ubatch": "512",
        "--flash_attn": "False",
        "--logits_all": "False",  # the server's default True evaluates the vocabulary for every prompt token
        "--interrupt_requests": "False",  # the default True ends a stream as soon as another request waits
        "--cache": "False",
    }
    cached = peer.llama_cpp_command(Path("p"), replace(opts, cache=True, cache_size=1 << 30, flash_attn=True))
    assert cached[cached.index("--cache") + 1] == "True"
    assert cached[cached.index("--cache_type") + 1] == "ram"
    assert cached[cached.index("--cache_size") + 1] == str(1 << 30)
    assert cached[cached.index("--flash_attn") + 1] == "True"
    extra = peer.llama_cpp_command(Path("p"), replace(opts, extra_args=("--verbose", "False")))
    assert extra[-2:] == ["--verbose", "False"]


def test_options_are_checked_before_a_server_starts(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        peer.LlamaCppOptions(gguf=tmp_path / "missing.gguf").check()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(BadInput, match="n_threads must be positive"):
        peer.LlamaCppOptions(gguf=gguf, n_threads=0).check()
    with pytest.raises(BadInput, match="n_ubatch"):
        peer.LlamaCppOptions(gguf=gguf, n_batch=256, n_ubatch=512).check()


def test_the_environment_keeps_llmkiln_off_the_servers_path(tmp_path):
    opts = peer.LlamaCppOptions(gguf=tmp_path / "m.gguf", n_threads=2, n_threads_batch=2)
    env = peer.llama_cpp_env(Path("/v"), opts, base={"PATH": "/usr/bin", "PYTHONPATH": "/repo", "HOME": "/h"})
    assert "PYTHONPATH" not in env and env["HOME"] == "/h"
    assert env["PATH"].split(":")[0] == "/v/bin" and env["VIRTUAL_ENV"] == "/v"
    assert env["OMP_NUM_THREADS"] == "2"
    env = peer.llama_cpp_env(Path("/v"), replace(opts, extra_env={"OMP_NUM_THREADS": "1"}), base={})
    assert env["OMP_NUM_THREADS"] == "1"


def test_a_missing_or_unfinished_venv_names_the_env_script(tmp_path, monkeypatch):
    monkeypatch.delenv(peer.VENV_ENV, raising=False)
    with pytest.raises(peer.PeerNotInstalled, match="scripts/llama_cpp_env.sh"):
        peer.find_venv(tmp_path / "none")
    unfinished = fake_venv(tmp_path / "a", stamp=False)
    with pytest.raises(peer.PeerNotInstalled, match="no finished llama-cpp-python"):
        peer.find_venv(unfinished)
    venv = fake_venv(tmp_path / "b")
    assert peer.find_venv(venv) == venv
    monkeypatch.setenv(peer.VENV_ENV, str(venv))
    assert peer.find_venv() == venv
    assert issubclass(peer.PeerNotInstalled, BadInput)  # exit 2


def test_the_experiment_stops_with_exit_2_before_anything_runs(
    tmp_path, model_dir, ggufs, capsys, monkeypatch
):
    monkeypatch.delenv(peer.VENV_ENV, raising=False)
    argv = ["--model", str(model_dir), "--out", str(tmp_path / "out"), "--venv", str(tmp_path / "none")]
    with pytest.raises(SystemExit) as exc:
        exp.main([*argv, "--gguf", ggufs[0]])
    assert exc.value.code == 2
    assert "scripts/llama_cpp_env.sh" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exc:
        exp.main([*argv, "--gguf", "no-equals-sign"])
    assert exc.value.code == 2


# ---------------------------------------------------------------------------------------------------------------
# Tokens


def test_tokenization_check_finds_the_first_difference(tok):
    prompts = ["the kiln is hot", "System: you are a careful assistant"]
    same = check_tokenization(lambda p: tok.encode(p).ids, tok, prompts)
    assert same == {
        "same": True,
        "prompts": 2,
        "tokens": [len(tok.encode(p).ids) for p in prompts],
        "first_difference": None,
    }
    require_same_tokens(same, "llama.cpp")
    with_bos = check_tokenization(lambda p: [0, *tok.encode(p).ids], tok, prompts)
    assert not with_bos["same"] and with_bos["prompts"] == 1
    diff = with_bos["first_difference"]
    assert (diff["prompt"], diff["at"], diff["peer_tokens"] - diff["llmkiln_tokens"]) == (0, 0, 1)
    with pytest.raises(KilnError, match="tokenizes the prompts differently"):
        require_same_tokens(with_bos, "llama.cpp")


# ---------------------------------------------------------------------------------------------------------------
# The run's sizes


def test_sizes_are_cpu_peers_and_quick_is_one_level(model_dir, ggufs):
    full = exp.PeerConfig.make(model_dir, tuple(ggufs))
    base = CpuPeersConfig.make()
    assert full.sizes.spec() == base.spec()
    assert (full.sizes.levels, full.sizes.requests, full.sizes.warmup) == ((1, 4, 8), (24, 32, 64), 8)
    assert full.ggufs == (("q4_1", Path(ggufs[0].split("=")[1])), ("f16", Path(ggufs[1].split("=")[1])))
    quick = exp.PeerConfig.make(model_dir, tuple(ggufs), quick=True)
    assert (quick.sizes.levels, quick.sizes.requests, quick.sizes.warmup) == ((4,), (8,), 2)
    assert quick.sizes.system_tokens == CpuPeersConfig.make(quick=True).system_tokens
    assert quick.out_dir == Path("bench/results/raw/cpu-peers-quick")
    assert exp.PeerConfig.make(model_dir, (), quick=True, concurrency="1,4").sizes.levels == (1, 4)
    with pytest.raises(BadInput, match="distinct"):
        exp.PeerConfig.make(model_dir, ("a=x.gguf", "a=y.gguf"))
    with pytest.raises(BadInput, match="NAME=PATH"):
        exp.parse_gguf("=x.gguf")
    with pytest.raises(BadInput, match="positions"):
        exp.PeerConfig.make(model_dir, (), n_ctx=1024)


def test_the_recorded_command_repeats_the_run(model_dir, ggufs, tmp_path):
    cfg = exp.PeerConfig.make(
        model_dir, tuple(ggufs), quick=True, out_dir=tmp_path / "o", flash_attn=True, prompt_cache=True
    )
    args = shlex.split(cfg.command())
    assert args[:3] == ["python", "-m", "experiments.cpu_peer_llama_cpp"]
    ctx = exp.cli.make_context("x", args[3:])
    again = exp.PeerConfig.make(
        ctx.params["model"],
        ctx.params["ggufs"],
        ctx.params["quick"],
        ctx.params["out_dir"],
        ctx.params["concurrency"],
        ctx.params["requests"],
        ctx.params["warmup"],
        ctx.params["venv"],
        ctx.params["threads"],
        ctx.params["n_ctx"],
        ctx.params["flash_attn"],
        ctx.params["prompt_cache"],
    )
    assert again == cfg


# ---------------------------------------------------------------------------------------------------------------
# End to end against a stand-in server


class StandIn:
    """A loopback OpenAI server answering like llama-cpp-python's: streamed completions one token per chunk with a
    finish_reason on the last and no usage, /extras/tokenize with `ids(text)`, a chat answer."""

    def __init__(self, ids, answer: str = "The capital of France is Paris.") -> None:
        self.ids, self.answer, self.prompts = ids, answer, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _json(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": "llmkiln", "object": "model"}]})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/extras/tokenize":
                    return self._json({"tokens": outer.ids(req["input"])})
                if self.path == "/v1/chat/completions":
                    return self._json(
                        {"choices": [{"message": {"role": "assistant", "content": outer.answer}}]}
                    )
                assert self.path == "/v1/completions" and req["stream"] and isinstance(req["prompt"], str)
                outer.prompts.append(req["prompt"])
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                n = req["max_tokens"]
                for k in range(n):
                    chunk = {
                        "choices": [
                            {"text": " x", "index": 0, "finish_reason": "length" if k == n - 1 else None}
                        ]
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
                self.wfile.write(b"data: [DONE]\r\n\r\n")
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def fake_server_class(stand_in: StandIn, started: list):
    class FakeServer:
        def __init__(self, opts, venv=None, log_dir=None, echo=None, name="llama-cpp"):
            self.opts, self.name, self.url, self.model, self.ready_s = (
                opts,
                name,
                stand_in.url,
                "llmkiln",
                0.5,
            )
            self.proc = SimpleNamespace(
                command=["python", "-m", "llama_cpp.server", "--model", str(opts.gguf)]
            )
            self.proc.log_path = Path(log_dir) / f"{name}.log"
            started.append(self)

        def tokenize(self, prompt):
            return peer.tokenize(self.url, self.model, prompt)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    return FakeServer


@pytest.fixture
def stand_in(monkeypatch, tok, tmp_path):
    started: list = []
    with StandIn(lambda text: tok.encode(text).ids) as s:
        monkeypatch.setattr(exp, "LlamaCppServer", fake_server_class(s, started))
        monkeypatch.setattr(exp, "find_venv", lambda venv: tmp_path / "venv")
        monkeypatch.setattr(
            exp,
            "versions",
            lambda venv: {"llama-cpp-python": peer.VERSION, "python": "3.11", "system_info": "AVX2 = 1"},
        )
        s.started = started
        yield s


def test_quick_run_writes_reports_and_summary_entries(stand_in, model_dir, ggufs, tmp_path, tok):
    cfg = exp.PeerConfig.make(model_dir, tuple(ggufs), quick=True, out_dir=tmp_path / "out")
    md, summary = exp.run_peer(cfg)
    assert [s.opts.gguf.name for s in stand_in.started] == ["model.q4_1.gguf", "model.f16.gguf"]
    assert all(s.opts.n_ctx == 8192 and s.opts.interrupt_requests is False for s in stand_in.started)
    # every request the harness sent is the workload's prompt text (2 warm-up + 8 measured, per GGUF)
    assert len(stand_in.prompts) == 2 * (2 + 8)
    assert set(summary["systems"]) == {"llama-cpp-q4_1", "llama-cpp-f16"}
    for name, entry in summary["systems"].items():
        assert entry["kind"] == exp.KIND and entry.get("error") is None, entry.get("error")
        assert entry["precision"] == name.removeprefix("llama-cpp-")
        assert entry["chat_check"]["ok"] and "Paris" in entry["chat_check"]["answer"]
        assert entry["tokenization"]["same"] and entry["tokenization"]["prompts"] == 10
        lv = entry["levels"]["4"]
        assert (lv["requests"], lv["errors"], lv["output_tokens_mean"]) == (8, 0, cfg.sizes.output_tokens)
        assert (
            lv["server_prompt_tokens_mean"] is None and lv["cached_tokens_mean"] is None
        )  # no usage streamed
        assert lv["chunks_per_token"] == 1.0
        assert metric(summary, name, 4, "output_tok_s")[0] > 0
        report = load_report(cfg.out_dir / f"{name}.json")
        assert report.run.system == exp.SYSTEM and report.run.api == "completions"
        assert [x.concurrency for x in report.levels] == [4]
        assert (cfg.raw_dir / f"{name}.jsonl").is_file()
    # the same shape as cpu_peers' summary.json: its renderer takes it (the front door row included)
    saved = json.loads((cfg.out_dir / "summary.json").read_text())
    assert {"config", "command", "machine", "versions", "model", "systems", "targets"} <= set(saved)
    assert (
        saved["config"]["levels"] == [4]
        and saved["versions"]["llama-cpp"]["llama-cpp-python"] == peer.VERSION
    )
    assert FRONT_DOORS[exp.KIND] == exp.FRONT_DOOR
    text = md.read_text()
    assert "| llama-cpp-q4_1 | " + exp.FRONT_DOOR in text and "| 4 | llama-cpp-f16 |" in text
    assert exp.resummarize(cfg.out_dir).read_text() == text


def test_entries_join_a_cpu_peers_run_on_the_same_model_only(stand_in, model_dir, ggufs, tmp_path):
    cfg = exp.PeerConfig.make(model_dir, tuple(ggufs[:1]), quick=True, out_dir=tmp_path / "out")
    cfg.out_dir.mkdir(parents=True)
    theirs = exp.new_summary(cfg)
    theirs["systems"]["other"] = {"kind": "dynamo", "recipe": "r", "precision": "fp32", "levels": {}}
    theirs["machine"] = {"cpu_model": "x", "loadavg_start": [0.0]}
    (cfg.out_dir / "summary.json").write_text(json.dumps(theirs))
    _, summary = exp.run_peer(cfg)
    assert set(summary["systems"]) == {"other", "llama-cpp-q4_1"}
    assert summary["machine"]["cpu_model"] == "x"
    elsewhere = tmp_path / "hf-copy"
    shutil.copytree(model_dir, elsewhere)
    other = replace(cfg, model=elsewhere)
    with pytest.raises(BadInput, match="one summary, one model"):
        exp.run_peer(other)
    sizes = replace(cfg, sizes=replace(cfg.sizes, output_tokens=16))
    with pytest.raises(BadInput, match="other workload sizes"):
        exp.run_peer(sizes)


def test_a_tokenizer_difference_or_a_wrong_answer_fails_the_system(
    monkeypatch, tok, model_dir, ggufs, tmp_path
):
    monkeypatch.setattr(exp, "find_venv", lambda venv: tmp_path / "venv")
    monkeypatch.setattr(exp, "versions", lambda venv: {})
    cfg = exp.PeerConfig.make(model_dir, tuple(ggufs[:1]), quick=True, out_dir=tmp_path / "a")
    with StandIn(lambda text: [0, *tok.encode(text).ids]) as s:  # a BOS that llmkiln's tokenizer does not add
        monkeypatch.setattr(exp, "LlamaCppServer", fake_server_class(s, []))
        _, summary = exp.run_peer(cfg)
        assert not s.prompts  # nothing measured
    entry = summary["systems"]["llama-cpp-q4_1"]
    assert "tokenizes the prompts differently" in entry["error"] and not entry["levels"]
    assert not (cfg.out_dir / "llama-cpp-q4_1.json").exists()
    with StandIn(lambda text: tok.encode(text).ids, answer="I do not know.") as s:
        monkeypatch.setattr(exp, "LlamaCppServer", fake_server_class(s, []))
        _, summary = exp.run_peer(replace(cfg, sizes=replace(cfg.sizes, out_dir=tmp_path / "b")))
    assert "does not name Paris" in summary["systems"]["llama-cpp-q4_1"]["error"]


def test_help_runs_as_a_module():
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "experiments.cpu_peer_llama_cpp", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--gguf" in out.stdout and "--quick" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# The scripts: bad input stops them (exit 2) before anything is installed or converted


def _script(*args, env=None):
    import os
    import subprocess

    return subprocess.run(
        ["bash", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_the_env_script_needs_its_python_and_installs_nothing_without_it(tmp_path):
    out = _script(
        "scripts/llama_cpp_env.sh",
        str(tmp_path / "venv"),
        env={"LLMKILN_LLAMACPP_PYTHON": str(tmp_path / "no")},
    )
    assert out.returncode == 2 and "LLMKILN_LLAMACPP_PYTHON" in out.stderr and out.stdout == ""
    assert not (tmp_path / "venv").exists()


def test_the_gguf_script_checks_its_arguments_first(tmp_path):
    assert _script("scripts/llama_cpp_gguf.sh").returncode == 2
    assert "no such folder" in _script("scripts/llama_cpp_gguf.sh", str(tmp_path / "x"), "o.gguf").stderr
    out = _script("scripts/llama_cpp_gguf.sh", str(tmp_path), "o.gguf")
    assert out.returncode == 2 and "not a Hugging Face folder" in out.stderr
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    out = _script("scripts/llama_cpp_gguf.sh", str(tmp_path), "o.gguf", "q8_0")
    assert out.returncode == 2 and "choose f16 or bf16" in out.stderr
    assert not (tmp_path / "o.gguf").exists()
