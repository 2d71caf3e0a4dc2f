"""What tritonserver leaves in the process table and /dev/shm, found through the unique shared-memory prefix
every llmkiln server gets (`--backend-config=python,shm-region-prefix-name=<prefix>`).

- `processes_with(text)`: pids whose command line holds `text` (a server's prefix: tritonserver and its stubs).
- `children(pids)`: the live children of `pids` (a stub's guard process).
- `stale_servers(ports)`: llmkiln tritonservers listening on one of `ports` whose parent is gone (a `kiln serve`
  that was killed before tritonserver learned to die with its parent), or any llmkiln server on those ports.
- `remove_orphan_shm()`: /dev/shm files of llmkiln servers no process carries any more (a killed server's).
- `remove_dead_workdirs()`: `llmkiln-serve-<pid>-*` temp folders whose `kiln serve` is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_BASE_PREFIX = "triton_python_backend_shm_region"
LLMKILN_SHM_PREFIX = f"{SHM_BASE_PREFIX}_llmkiln_"
WORKDIR_PREFIX = "llmkiln-serve-"
SHM_ID_LEN = 8  # hex digits after LLMKILN_SHM_PREFIX: one server's id (TritonServer.shm_prefix)
# a server's prefix exactly: its stubs' region names go on with more hex digits (a uuid), so a greedy match would
# name a prefix no process carries, and a server starting beside another would remove the region the other's
# tritonserver just made before its stub opened it (seen: three servers started together, a stub dying on "Unable
# to initialize shared memory key ... No such file or directory", then "double free", its server never ready)
_PREFIX_RE = re.compile(re.escape(LLMKILN_SHM_PREFIX) + f"[0-9a-f]{{{SHM_ID_LEN}}}")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", errors="replace") for a in raw.split(b"\0") if a]


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    info = _ppid_and_state(pid)
    return info is not None and info[1] not in ("Z", "X")


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def children(parents: list[int]) -> list[int]:
    """Pids (not zombies) whose parent is one of `parents`."""
    want = set(parents)
    out = []
    for pid in _pids():
        info = _ppid_and_state(pid)
        if info is not None and info[0] in want and info[1] not in ("Z", "X"):
            out.append(pid)
    return out


def processes_with(text: str) -> list[int]:
    """Pids (not zombies) whose command line contains `text`."""
    needle = text.encode()
    out = []
    for pid in _pids():
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes() and alive(pid):
                out.append(pid)
        except OSError:
            continue
    return out


@dataclass(frozen=True)
class StaleServer:
    """An llmkiln tritonserver found on a port we want."""

    pid: int
    parent: int
    orphaned: bool  # its parent is gone (init or a subreaper adopted it)
    port_flag: str

    def describe(self) -> str:
        why = (
            "a stale server left by a killed `kiln serve` (its parent is gone)"
            if self.orphaned
            else f"an llmkiln server still run by pid {self.parent}"
        )
        return f"held by tritonserver pid {self.pid}, {why}; stop it with `kill {self.pid}` and start again"


def stale_servers(ports: dict[str, int]) -> list[StaleServer]:
    """llmkiln tritonservers whose command line binds one of `ports` ({'--http-port': 8000, ...})."""
    found = []
    for pid in _pids():
        args = _cmdline(pid)
        if not args or not args[0].endswith("tritonserver") or not any(LLMKILN_SHM_PREFIX in a for a in args):
            continue
        info = _ppid_and_state(pid)
        if info is None or info[1] in ("Z", "X"):
            continue
        parent = info[0]
        for flag, port in ports.items():
            if f"{flag}={port}" in args:
                parent_args = _cmdline(parent)
                launcher = " ".join(parent_args)
                orphaned = parent <= 1 or not any(k in launcher for k in ("python", "kiln", "pytest"))
                found.append(StaleServer(pid, parent, orphaned, flag))
    return found


def remove_orphan_shm() -> list[Path]:
    """Remove /dev/shm files of llmkiln python backends whose prefix no running process carries."""
    removed = []
    prefixes: dict[str, list[Path]] = {}
    for f in SHM_DIR.glob(f"{LLMKILN_SHM_PREFIX}*"):
        m = _PREFIX_RE.match(f.name)
        if m:
            prefixes.setdefault(m.group(0), []).append(f)
    for prefix, files in prefixes.items():
        if processes_with(prefix):
            continue
        for f in files:
            with contextlib.suppress(OSError):
                f.unlink()
                removed.append(f)
    return removed


def new_workdir() -> Path:
    """A fresh `llmkiln-serve-<pid>-*` temp folder (the pid lets a later start remove it if we are killed)."""
    return Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))


def remove_dead_workdirs() -> list[Path]:
    """Remove `llmkiln-serve-<pid>-*` temp folders whose process is gone (a killed `kiln serve`)."""
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        m = re.match(re.escape(WORKDIR_PREFIX) + r"(\d+)-", d.name)
        if m and d.is_dir() and not alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed
