"""The python-backend stub leaves when its tritonserver is gone — guarded by the kernel, not only by a thread.

Measured with Triton 2.51 (nvidia-pytriton 0.7.0): when tritonserver is killed (e.g. with its `kiln serve`, by
the parent-death signal), its python stub lives on, reparented to init, and keeps the server's listening sockets
it inherited and its /dev/shm region. A watch thread that polls the parent is not enough: it needs the GIL, and a
stub whose threads all sit in a futex wait (seen: 37 minutes, 13 threads) never runs it; a SIGSTOPped stub
(`scripts`-free repro: tests/serve/test_crash_supervision.py) never runs anything.

`prctl(PR_SET_PDEATHSIG)` set in the stub does not work here: the parent-death signal follows the parent *thread*
that forked, and Triton 2.51 forks the stub from a model-instance thread that ends once the instance is
initialized — measured: the stub got SIGKILL right after `initialize`, while tritonserver lived on. So the stub
starts a guard process (`GUARD`, plain Python without site or llmkiln): its own parent-death signal is bound to
the stub's main thread (which runs `initialize` and lives as long as the stub), it waits on a pidfd of
tritonserver (no polling, no GIL of the stub involved) and SIGKILLs the stub the moment tritonserver exits. The
polling thread stays as a second guard.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

POLL_S = 0.25
GUARD_NAME = "llmkiln-stub-guard"

# argv: server pid, stub pid. Kills the stub when the server exits; dies with the stub (its parent).
GUARD = """
import ctypes, os, select, signal, sys, time
server, stub = int(sys.argv[1]), int(sys.argv[2])
ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the stub goes
if os.getppid() != stub:
    sys.exit(0)  # the stub is gone already
def server_of_stub():
    try:
        return int(open(f"/proc/{stub}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
try:
    fd = os.pidfd_open(server)
except ProcessLookupError:
    fd = None
except OSError:  # no pidfd (Linux < 5.3): poll the stub's parent
    fd = -1
if fd is not None and fd >= 0:
    select.select([fd], [], [])
elif fd == -1:
    while server_of_stub() == server:
        time.sleep(0.25)
os.kill(stub, signal.SIGKILL)
"""


def _python() -> str | None:
    """A Python interpreter for the guard (the stub embeds Python, so sys.executable may not be one)."""
    for cand in (sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or ""):
        if cand and os.path.basename(cand).startswith("python") and os.access(cand, os.X_OK):
            return cand
    return None


def start_guard(server_pid: int) -> subprocess.Popen[bytes] | None:
    """Start the guard process that SIGKILLs this process when `server_pid` (our parent) exits; None when no
    Python interpreter is found. Call it from the thread that lives as long as this process (the main thread)."""
    python = _python()
    if python is None:
        return None
    return subprocess.Popen(
        [python, "-I", "-S", "-c", GUARD, str(server_pid), str(os.getpid()), GUARD_NAME],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,  # holds none of the stub's sockets or shared memory
    )


def exit_with_parent(poll_s: float = POLL_S) -> threading.Thread:
    """Die with the parent (tritonserver): the guard process (kernel-driven, see the module docstring) and a
    daemon thread that ends this process (os._exit) when its parent is gone."""
    parent = os.getppid()
    start_guard(parent)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    thread = threading.Thread(target=watch, name="llmkiln-parent-watch", daemon=True)
    thread.start()
    return thread
