"""The python-backend stub leaves when its tritonserver is gone.

Measured with Triton 2.51 (nvidia-pytriton 0.7.0): when tritonserver is killed (e.g. with its `kiln serve`, by
the parent-death signal), its python stub lives on for minutes, reparented to init, and keeps the server's
listening sockets it inherited — the ports stay taken. The model starts this watch in the stub: once the
stub's parent changes, it exits at once.
"""

from __future__ import annotations

import os
import threading
import time

POLL_S = 0.25


def exit_with_parent(poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (os._exit) when its parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    thread = threading.Thread(target=watch, name="llmkiln-parent-watch", daemon=True)
    thread.start()
    return thread
