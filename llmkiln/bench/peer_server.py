"""The lifecycle every peer server process shares (vLLM's CPU build, llama.cpp's server): wait until it serves the
model, stop it (SIGTERM to its process group, SIGKILL past a timeout, the reaper closed), and use it as a context
manager. Each peer says how to start it, when it is ready and what it leaves behind (`_after_stop`)."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Self

from llmkiln.dynamo.launcher import LaunchFailed

if TYPE_CHECKING:
    from llmkiln.dynamo.launcher import Proc
    from llmkiln.serve.reaper import Reaper

STOP_TIMEOUT_S = 30.0


class PeerServer:
    """Subclasses set `proc`, `reaper`, `ready_s`, the class attributes below and `label()` (readiness errors),
    and implement `start()` and `ready()`."""

    display: str  # the peer in the stop message ("vLLM", "llama.cpp")
    poll_s: float  # between readiness probes
    ready_timeout_s: float  # wait_ready's default
    proc: Proc
    reaper: Reaper | None
    ready_s: float | None

    def label(self) -> str:
        return self.display

    def start(self) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

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
