"""llama.cpp's server (llama-cpp-python 0.3.36, `python -m llama_cpp.server`) as a served CPU peer: started,
measured and stopped like llmkiln's own servers and the vLLM peer (llmkiln.bench.vllm_peer).

The server runs from its own venv (scripts/llama_cpp_env.sh: llama-cpp-python built from source with
-DGGML_NATIVE=ON; `find_venv` says how to make it when it is missing) on one GGUF file, on 127.0.0.1, and is
measured with the same OpenAI client as llmkiln's Dynamo endpoint and vLLM (llmkiln.bench.openai_client through
llmkiln.bench.runner, completions). How it is run (`llama_cpp_command`):

    VENV/bin/python -P -m llama_cpp.server --model GGUF --model_alias NAME --host 127.0.0.1 --port P
        --n_threads 2 --n_threads_batch 2 --n_ctx 8192 --n_batch 512 --n_ubatch 512 --flash_attn False
        --logits_all False --interrupt_requests False --cache False

What this server is, read from llama-cpp-python 0.3.36's source and checked against the running server (these are
properties of the peer, reported as such, not worked around):
- **No concurrency, no batching.** The server holds one `llama_cpp.Llama` behind a global lock
  (llama_cpp/server/app.py, `get_llama_proxy`: an outer and an inner anyio.Lock); each request, streaming included,
  holds it from its prompt's evaluation to its last token. Concurrent requests are served one at a time, in
  arrival order (anyio's Lock is FIFO): at concurrency c a request's TTFT includes the whole service time of the
  requests ahead of it, and output tok/s does not grow with c. (llama.cpp's C++ `llama-server` has parallel slots
  and continuous batching; this Python server does not use them.)
- **`--interrupt_requests` defaults to True**: a streaming response is ended ([DONE]) as soon as another request
  waits for the lock, so under concurrency every stream but the last would stop after one token. It is set to
  False here: every request runs to its max_tokens (or EOS).
- **Prefix reuse without a cache**: `Llama.generate` keeps the last request's KV and evaluates only the prompt past
  the longest common prefix with it (`kv_cache_seq_rm`), so on the shared-prefix workload, served in sequence,
  each request prefills only its user turn. `--cache True` (LlamaRAMCache, `cache=True` here) additionally saves
  the whole llama state after every completion and reloads a saved one when its prefix is longer than the live
  context's — which never happens when one system prompt is served in sequence, so it only adds the save: off by
  default (the experiment's `--prompt-cache` turns it on to measure that).
- **`logits_all` defaults to True** in the server's settings: the vocabulary projection for every prompt token
  (49152 x 576 per token for SmolLM2-135M), which nothing here reads: set to False.
- **Text prompts only**: `/v1/completions` takes `prompt: str | list[str]` (a list of token ids fails pydantic's
  validation: HTTP 500 "Input should be a valid string"; llama.cpp's C++ server takes ids, this one does not), and the server tokenizes it with the GGUF's vocabulary
  (`tokenize(add_bos=False, special=True)`, plus the BOS when the GGUF's `tokenizer.ggml.add_bos_token` is true).
  So the peer gets the harness's prompt text, and `peer_server.check_tokenization` compares the running server's ids
  (`/extras/tokenize`, the same tokenize call with the same BOS rule) with llmkiln's tokenizer.json for every
  prompt before anything is measured: equal ids there are equal ids in the completion.
- **No usage in the stream** (no `stream_options.include_usage`, no `prompt_tokens_details.cached_tokens`): the
  client counts one output token per content chunk (each chunk is one token here), and there is no server-side
  prompt-token or cached-token count.

`LlamaCppServer` starts it the way `VllmServer` does (llmkiln.dynamo.launcher.Proc: its own session, a parent-death
signal from the kernel through `setpriv --pdeathsig KILL`, a reaper — llmkiln.serve.reaper — that kills its
process group or cgroup if this process dies, its output in a log file), waits until /v1/models lists the model,
and stops it with SIGTERM to its process group, then SIGKILL past a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from llmkiln.bench.peer_server import PeerServer, post_json
from llmkiln.dynamo.launcher import Proc
from llmkiln.errors import BadInput
from llmkiln.serve.ports import free_ports
from llmkiln.serve.reaper import Reaper

ENV_SCRIPT = "scripts/llama_cpp_env.sh"
VENV_ENV = "LLMKILN_LLAMACPP_VENV"
DEFAULT_VENV = Path("/tmp/llmkiln-llamacpp/venv")
VENV_STAMP = ".llmkiln-llama-cpp"  # written by scripts/llama_cpp_env.sh when the install finished
VERSION = "0.3.36"
# the greedy answer of the sanity check (`ask`) must contain this
CHECK_QUESTION = "What is the capital of France? Answer in one sentence."
CHECK_ANSWER = "Paris"


class PeerNotInstalled(BadInput):
    """The llama.cpp venv is missing or broken (exit 2): the message names scripts/llama_cpp_env.sh."""


def _flag(value: bool) -> str:
    return "True" if value else "False"  # the server's pydantic-settings CLI takes True/False


@dataclass(frozen=True)
class LlamaCppOptions:
    """One llama-cpp-python server (see the module docstring for what each becomes and why)."""

    gguf: Path
    served_model_name: str = "llmkiln"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port when the server starts
    n_threads: int = 2  # decode threads
    n_threads_batch: int = 2  # prompt (batch) threads
    n_ctx: int = 8192  # the model's positions (SmolLM2: 8192)
    n_batch: int = 512  # logical batch of a prompt evaluation
    n_ubatch: int = 512  # physical batch
    flash_attn: bool = False
    cache: bool = False  # --cache: the RAM prompt cache (LlamaRAMCache)
    cache_size: int = 2 << 30  # bytes, with cache
    logits_all: bool = False
    interrupt_requests: bool = False
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        if not Path(self.gguf).is_file():
            raise BadInput(f"--gguf {self.gguf}: no such file (a GGUF model for llama.cpp)")
        for name in ("n_threads", "n_threads_batch", "n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) <= 0:
                raise BadInput(f"llama.cpp {name} must be positive, got {getattr(self, name)}")
        if self.n_ubatch > self.n_batch:
            raise BadInput(f"llama.cpp n_ubatch {self.n_ubatch} > n_batch {self.n_batch}")


def find_venv(venv: Path | str | None = None) -> Path:
    """The llama.cpp venv: `venv`, else $LLMKILN_LLAMACPP_VENV, else /tmp/llmkiln-llamacpp/venv; PeerNotInstalled
    when it has no finished llama-cpp-python install (the message says how to make it)."""
    path = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV)
    make = f"bash {ENV_SCRIPT} {path}"
    if not os.access(path / "bin" / "python", os.X_OK):
        raise PeerNotInstalled(
            f"llama.cpp peer: no venv at {path} (llama-cpp-python is not installed): run `{make}` (a source build: "
            f"about 10 minutes on 2 cores; --venv / ${VENV_ENV} point elsewhere)"
        )
    if (
        not list((path / "lib").glob(f"python3*/site-packages/llama_cpp_python-{VERSION}.dist-info"))
        or not (path / VENV_STAMP).is_file()
    ):
        raise PeerNotInstalled(
            f"llama.cpp peer: {path} has no finished llama-cpp-python {VERSION} install: run `{make}`"
        )
    return path


def llama_cpp_command(python: Path, opts: LlamaCppOptions) -> list[str]:
    """The server's argv (`opts.port` must be set)."""
    argv = [
        str(python),
        "-P",  # nothing from the working directory on sys.path
        "-m",
        "llama_cpp.server",
        "--model",
        str(opts.gguf),
        "--model_alias",
        opts.served_model_name,
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        "--n_threads",
        str(opts.n_threads),
        "--n_threads_batch",
        str(opts.n_threads_batch),
        "--n_ctx",
        str(opts.n_ctx),
        "--n_batch",
        str(opts.n_batch),
        "--n_ubatch",
        str(opts.n_ubatch),
        "--flash_attn",
        _flag(opts.flash_attn),
        "--logits_all",
        _flag(opts.logits_all),
        "--interrupt_requests",
        _flag(opts.interrupt_requests),
        "--cache",
        _flag(opts.cache),
    ]
    if opts.cache:
        argv += ["--cache_type", "ram", "--cache_size", str(opts.cache_size)]
    return argv + list(opts.extra_args)


def llama_cpp_env(venv: Path, opts: LlamaCppOptions, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) with the venv first on PATH, llmkiln's own import path
    removed, and OMP_NUM_THREADS = the prompt threads (ggml's OpenMP pool)."""
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        {
            "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(max(opts.n_threads, opts.n_threads_batch)),
            "HF_HUB_OFFLINE": "1",
        }
    )
    env.update(opts.extra_env)
    return env


def versions(venv: Path) -> dict[str, str]:
    """llama-cpp-python, the Python version and llama.cpp's system info (the CPU features it was built for)."""
    code = (
        "import importlib.metadata as m, json, platform, llama_cpp; "
        "print(json.dumps({'llama-cpp-python': m.version('llama-cpp-python'), 'python': platform.python_version(), "
        "'system_info': llama_cpp.llama_print_system_info().decode().strip()}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise PeerNotInstalled(
            f"llama.cpp peer: {venv} is broken ({out.stderr.strip()[-300:]}): rerun `bash {ENV_SCRIPT} {venv}`"
        )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


class LlamaCppServer(PeerServer):
    """One llama-cpp-python server process (see the module docstring). Use as a context manager."""

    display = "llama.cpp"
    reaper_name = "llama-cpp"
    opts: LlamaCppOptions
    poll_s = 0.25
    ready_timeout_s = 300.0

    def __init__(
        self,
        opts: LlamaCppOptions,
        venv: Path | str | None = None,
        log_dir: Path | None = None,
        echo: IO[str] | None = None,
        name: str = "llama-cpp",
    ) -> None:
        opts.check()
        self.venv = find_venv(venv)
        self.opts = opts if opts.port else replace(opts, port=free_ports(1, opts.host)[0])
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llmkiln-llamacpp-"))
        self.echo = echo
        self.name = name
        self.proc = Proc(
            name,
            llama_cpp_command(self.venv / "bin" / "python", self.opts),
            llama_cpp_env(self.venv, self.opts),
            self.log_dir / f"{name}.log",
        )
        self.reaper: Reaper | None = None
        self.ready_s: float | None = None

    def tokenize(self, prompt: str) -> list[int]:
        return tokenize(self.url, self.model, prompt)

    def label(self) -> str:
        return f"llama.cpp server ({self.opts.gguf.name})"


def tokenize(url: str, model: str, prompt: str) -> list[int]:
    """The server's token ids of `prompt` (its /extras/tokenize: the vocabulary of its GGUF, special tokens parsed,
    the BOS when the GGUF asks for one — what its completions feed the model); `url` is its OpenAI base URL."""
    out = post_json(url.removesuffix("/v1") + "/extras/tokenize", {"model": model, "input": prompt})
    return [int(t) for t in out["tokens"]]


def ask(url: str, model: str, question: str = CHECK_QUESTION, max_tokens: int = 48) -> str:
    """The greedy answer of the server's chat endpoint to one user message (the GGUF's chat template, with its
    default system turn)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    out = post_json(url + "/chat/completions", body)
    return str(out["choices"][0]["message"]["content"])
