"""The calling thread's alternate signal stack, kept as it was across code that creates or destroys OpenVINO's
CPU plugin.

OpenVINO 2026.4's CPU plugin, when a Core creates it, saves the thread's alternate signal stack (`sigaltstack`)
and installs one of its own (11568 bytes, seen on an AMD EPYC Zen 5); when that plugin is destroyed it puts back
the one it saved and frees its own. Two Cores (two runners, or a runner and its cascade graph's twin in a test)
destroyed in the order they were created — not the reverse — leave the thread on the first plugin's freed stack:
the next signal with a handler (CPython installs its handlers with SA_ONSTACK) is delivered onto freed memory
and the process dies of SIGSEGV instead of running the handler. Seen: `kiln serve`'s SIGTERM drain in a test
process that had opened and closed runners earlier (the pytest process, killed mid-suite). Reproducer: two
`OpenVinoPagedRunner`s, closed first to last, then `os.kill(os.getpid(), SIGTERM)` with a Python handler.

`kept()` reads the stack on entry and puts it back on exit, so every plugin saves (and later restores) the
thread's own stack, whatever the order: nothing dangles. Without an alternate stack a handler runs on the
thread's stack (the default for every thread); the plugin's own stack is not needed by anything llmkiln runs.
Linux only; elsewhere, or if libc cannot be reached, it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SS_DISABLE = 2  # <signal.h> on Linux


class _Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def current() -> tuple[int, int, int] | None:
    """The calling thread's alternate signal stack: (address, flags, size); None where it cannot be read."""
    if _LIBC is None:
        return None
    st = _Stack()
    if _LIBC.sigaltstack(None, ctypes.byref(st)) != 0:
        return None
    return int(st.ss_sp or 0), int(st.ss_flags), int(st.ss_size)


def _set(stack: tuple[int, int, int]) -> None:
    assert _LIBC is not None
    sp, flags, size = stack
    st = _Stack(None, SS_DISABLE, 0) if flags & SS_DISABLE else _Stack(sp, 0, size)
    _LIBC.sigaltstack(ctypes.byref(st), None)


@contextmanager
def kept() -> Iterator[None]:
    """Run the body, then give the calling thread back the alternate signal stack it had before (a context
    manager, or a decorator: `@kept()`)."""
    before = current()
    try:
        yield
    finally:
        if before is not None and current() != before:
            _set(before)
