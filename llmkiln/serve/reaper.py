"""A supervisor that outlives its launcher: when `kiln serve` (either front door) dies — SIGKILL included — every
process it started dies too, and their /dev/shm files and state folders go.

Threads cannot do this (they die with the launcher), and parent-death signals alone leave gaps: tritonserver's
python stubs and Dynamo's processes are not all direct children of one long-lived thread. So each launch starts
one reaper (`python -m llmkiln.serve.reaper`) in its own session, with its stdin a pipe that only the launcher
holds. The launcher tells it, one line at a time, what to clean up:

    cgroup PATH            a cgroup v2 folder the launch's processes run in (killed as a whole: cgroup.kill)
    pgid PID STARTTIME     a process group led by PID (started at STARTTIME, /proc/PID/stat field 22)
    shm PREFIX             /dev/shm files whose names start with PREFIX
    rmtree PATH            a folder to remove
    keep PATH              a folder not to remove after all (a failed launch keeps its logs for the user)

When stdin reaches end-of-file — the launcher closed it after a clean stop, or the kernel closed it because the
launcher died — the reaper SIGKILLs the cgroup and the process groups, waits until they are empty, removes the
files and folders and exits. After a clean stop there is nothing left to kill and it exits at once.

The cgroup is the strongest guard (every descendant, whatever its session or parent, in one `cgroup.kill`); it
needs a writable cgroup v2 hierarchy (root, or a delegated subtree). Where there is none, the process groups
are the fallback (a process that leaves its group with setsid escapes them; Triton's stubs and Dynamo's
processes do not). A group id whose leader pid now belongs to another process (a different start time) is never
signalled: the kernel does not hand out a pid that is still some group's id, so such a group is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from llmkiln.env_switch import env_switch

SHM_DIR = Path("/dev/shm")
KILL_WAIT_S = 10.0
CGROUP_PREFIX = "llmkiln-"
CGROUP_ENV = "LLMKILN_CGROUP"


def die_with_parent(argv: list[str]) -> list[str]:
    """argv run under `setpriv --pdeathsig KILL` (util-linux): the kernel kills it when the thread that started
    it dies. Start it from a thread that lives as long as the child (the main thread)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def _own_cgroup() -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        pass
    return None


def make_cgroup(name: str) -> Path | None:
    """A fresh cgroup v2 folder below this process's own cgroup, or None where we may not create one, the
    kernel has no cgroup.kill (Linux < 5.14) or $LLMKILN_CGROUP is off (0: process groups only)."""
    if not env_switch(CGROUP_ENV, True):
        return None
    root, own = _cgroup2_root(), _own_cgroup()
    if root is None or own is None:
        return None
    path = root / own.lstrip("/") / f"{CGROUP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError:
        return None
    if not (path / "cgroup.kill").exists() or not os.access(path / "cgroup.procs", os.W_OK):
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


class Reaper:
    """The launcher's handle on its reaper process (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cgroup: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.cgroup = make_cgroup(self.name)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmkiln.serve.reaper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # survives a signal to the launcher's process group
            close_fds=True,
        )
        if self.cgroup is not None:
            self._send(f"cgroup {self.cgroup}")

    def _send(self, line: str) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run inside the launch's cgroup (joined before exec, so nothing it forks is ever outside)."""
        if self.cgroup is None:
            return argv
        join = '{ echo $$ > "$0"; } 2>/dev/null; exec "$@"'
        return ["/bin/sh", "-c", join, str(self.cgroup / "cgroup.procs"), *argv]

    def watch_group(self, pid: int) -> None:
        """Kill the process group led by `pid` (a child started with start_new_session) if the launcher dies."""
        started = start_time(pid)
        if started is not None:
            self._send(f"pgid {pid} {started}")

    def remove_shm(self, prefix: str) -> None:
        self._send(f"shm {prefix}")

    def remove_tree(self, path: Path) -> None:
        self._send(f"rmtree {path}")

    def keep_tree(self, path: Path) -> None:
        """Withdraw a remove_tree (the launch failed: its logs stay where the error message points)."""
        self._send(f"keep {path}")

    def close(self, timeout_s: float = 15.0) -> None:
        """The launch stopped: let the reaper clean what is left and exit; wait for it."""
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the reaper process ------------------------------------------------------------------------------------


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def _ours(pgid: int, started: int) -> bool:
    """False when the group's leader pid now belongs to another process (then our group is gone)."""
    now = start_time(pgid)
    return now is None or now == started


def _kill_group(pgid: int, started: int) -> None:
    if _ours(pgid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int, started: int) -> bool:
    return _ours(pgid, started) and bool(_members(pgid))


def _populated(cgroup: Path) -> bool:
    """True while the cgroup has a process (cgroup.events `populated 1`; exiting tasks count)."""
    try:
        return "populated 1" in (cgroup / "cgroup.events").read_text()
    except OSError:
        return False


def _rmdir(cgroup: Path, deadline: float) -> None:
    """Remove the cgroup; the kernel refuses (EBUSY) while a killed task is still exiting, so retry a while."""
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def reap(lines: IO[str]) -> None:
    """Read the launcher's lines until end-of-file, then kill and remove everything they named."""
    cgroups: list[Path] = []
    groups: list[tuple[int, int]] = []
    shm: list[str] = []
    trees: list[Path] = []
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "cgroup":
            cgroups.append(Path(rest))
        elif kind == "pgid":
            pid_text, started_text = rest.split()
            groups.append((int(pid_text), int(started_text)))
        elif kind == "shm":
            shm.append(rest)
        elif kind == "rmtree":
            trees.append(Path(rest))
        elif kind == "keep":
            trees = [t for t in trees if t != Path(rest)]
    for cg in cgroups:
        with contextlib.suppress(OSError):
            (cg / "cgroup.kill").write_text("1")
    for pgid, group_start in groups:
        _kill_group(pgid, group_start)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and (
        any(_populated(cg) for cg in cgroups) or any(_group_alive(*g) for g in groups)
    ):
        time.sleep(0.05)
    for cg in cgroups:
        _rmdir(cg, time.monotonic() + KILL_WAIT_S)
    for prefix in shm:
        for f in SHM_DIR.glob(f"{prefix}*"):
            with contextlib.suppress(OSError):
                f.unlink()
    for tree in trees:
        shutil.rmtree(tree, ignore_errors=True)


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    reap(sys.stdin)


if __name__ == "__main__":
    main()
