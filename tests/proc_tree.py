"""The process tree under a pid and a process's cgroup, read from /proc (the tests that check what a launcher left
behind)."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def in_cgroup(pid: int, cgroup: Path) -> bool:
    """True when `pid` runs in `cgroup` (its /proc/PID/cgroup v2 line ends with the folder's name)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return any(
        line.startswith("0::") and line.rstrip().endswith("/" + cgroup.name) for line in text.splitlines()
    )
