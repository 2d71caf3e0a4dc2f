"""What every peer server process shares (vLLM's CPU build, llama.cpp's server): its OpenAI URLs, a start on a
free port under a reaper, waiting until it serves the model (its /v1/models lists it, and its health path answers
200 where it has one), stop (SIGTERM to its process group, SIGKILL past a timeout, the reaper closed), use as a
context manager; and the check that it tokenizes the benchmark's prompts as llmkiln does (`check_tokenization`,
`require_same_tokens`). Each peer says how to build its process, how to ask it for token ids, and what it leaves
behind (`_after_stop`)."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol, Self

from llmkiln.dynamo.launcher import LaunchFailed
from llmkiln.errors import BadInput, KilnError
from llmkiln.serve.ports import port_free
from llmkiln.serve.reaper import Reaper

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from llmkiln.dynamo.launcher import Proc

STOP_TIMEOUT_S = 30.0


class PeerOptions(Protocol):
    """What a peer's options say about where it serves."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def served_model_name(self) -> str: ...


def get_json(url: str, timeout_s: float = 5.0) -> tuple[int, Any]:
    """(HTTP status, the JSON body or None)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def post_json(url: str, body: Mapping[str, Any], timeout_s: float = 120.0) -> Any:
    """The JSON answer to a JSON POST (urllib's errors raised)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


class PeerServer:
    """Subclasses set `opts`, `proc`, `echo`, `reaper`, `ready_s`, the class attributes below and `label()`
    (readiness errors), and may add to `start()` (`_starting`) and `stop()` (`_after_stop`)."""

    display: str  # the peer in messages ("vLLM", "llama.cpp")
    reaper_name: str  # its reaper's name ("vllm", "llama-cpp")
    health_path: str | None = None  # a path under the root URL that answers 200 once it is up, if it has one
    poll_s: float  # between readiness probes
    ready_timeout_s: float  # wait_ready's default
    opts: PeerOptions
    proc: Proc
    echo: IO[str] | None  # where the process's output is echoed
    reaper: Reaper | None
    ready_s: float | None

    @property
    def root_url(self) -> str:
        return f"http://{self.opts.host}:{self.opts.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL."""
        return self.root_url + "/v1"

    @property
    def model(self) -> str:
        return self.opts.served_model_name

    def label(self) -> str:
        return self.display

    def _starting(self) -> None:
        """Just before the process starts (what the peer must note then)."""

    def start(self) -> None:
        if not port_free(self.opts.host, self.opts.port):
            raise BadInput(f"{self.display} port {self.opts.port} is already in use on {self.opts.host}")
        self.reaper = Reaper(self.reaper_name)
        self.reaper.start()
        self._starting()
        self.proc.start(self.echo, self.reaper)

    def ready(self) -> bool:
        """It serves the model: its health path (if any) answers 200 and /v1/models lists the model."""
        try:
            if self.health_path is not None and get_json(self.root_url + self.health_path)[0] != 200:
                return False
            status, models = get_json(self.url + "/models")
        except (urllib.error.URLError, OSError, ValueError):
            return False
        ids = [m.get("id") for m in (models or {}).get("data", [])] if status == 200 else []
        return self.model in ids

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until the server serves the model; returns seconds waited (LaunchFailed with the log's tail)."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        while not self.ready():
            if not self.proc.alive():
                raise LaunchFailed(
                    f"{self.label()} exited before it was ready (exit code {self.proc.returncode()}). "
                    f"Last lines (full log: {self.proc.log_path}):\n{self.proc.tail()}"
                )
            if time.monotonic() - t0 > timeout_s:
                raise LaunchFailed(
                    f"{self.label()} not ready after {timeout_s:.0f} s; log {self.proc.log_path}:\n{self.proc.tail()}"
                )
            time.sleep(self.poll_s)
        self.ready_s = time.monotonic() - t0
        return self.ready_s

    def _after_stop(self) -> None:
        """What the peer's processes leave behind, removed once they are gone."""

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the server's process group, SIGKILL it past `timeout_s`; the reaper clears what is left."""
        self.proc.signal(signal.SIGTERM)
        if not self.proc.wait(timeout_s):
            self.proc.lines.append(f"llmkiln: {self.display} did not stop within {timeout_s:.0f} s: killed")
            self.proc.signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None
        self._after_stop()
        return self.proc.returncode()

    def __enter__(self) -> Self:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def check_tokenization(
    tokenize: Callable[[str], list[int]], tok: Tokenizer, prompts: Sequence[str]
) -> dict[str, Any]:
    """Compare the peer's ids of each prompt (`tokenize`) with llmkiln's tokenizer (`encode` with special tokens:
    what llmkiln's servers feed the model). {"same", "prompts" (how many compared), "tokens" (llmkiln's count per
    prompt), "first_difference"}; it stops at the first prompt that differs."""
    out: dict[str, Any] = {"same": True, "prompts": 0, "tokens": [], "first_difference": None}
    for i, prompt in enumerate(prompts):
        theirs, ours = tokenize(prompt), tok.encode(prompt).ids
        out["prompts"] += 1
        if theirs != ours:
            at = next((k for k, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None)
            at = at if at is not None else min(len(theirs), len(ours))
            out["same"] = False
            out["first_difference"] = {
                "prompt": i,
                "peer_tokens": len(theirs),
                "llmkiln_tokens": len(ours),
                "at": at,
                "peer_ids": theirs[max(0, at - 2) : at + 3],
                "llmkiln_ids": ours[max(0, at - 2) : at + 3],
            }
            break
        out["tokens"].append(len(ours))
    return out


def require_same_tokens(check: Mapping[str, Any], peer: str) -> None:
    """KilnError when `check_tokenization` found a difference: `peer` (its name) would see other prompts than
    llmkiln, and the comparison would not be like for like."""
    if not check.get("same"):
        raise KilnError(
            f"{peer} tokenizes the prompts differently from llmkiln's tokenizer.json (the comparison would not be "
            f"like for like): {check.get('first_difference')}"
        )
