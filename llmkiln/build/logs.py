"""Capture a build stage's output (Python prints, logging, tqdm bars, C++ libraries) into a log file.

Stages run under output_to(engines/.logs/<recipe>/<stage>.log), so `kiln build --quiet` prints nothing and
`--json` keeps stdout pure JSON lines, whatever the tools inside a stage print.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Send everything written to stdout/stderr to `path`, at the file-descriptor level (restored on exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            log.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def private_stdout() -> IO[str]:
    """A stream on a duplicate of the current stdout, unaffected by a later output_to (for progress output)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.stdout  # e.g. pytest's capsys: no real file descriptor
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", closefd=True)
