"""The alternate signal stack across OpenVINO CPU plugins (runtime/signal_stack.py): two runners closed in the order
they were opened leave the thread's stack as it was, and a signal with a Python handler is then handled, not a
SIGSEGV (OpenVINO 2026.4's plugin put back a freed stack of its own: the pytest process died that way mid-suite on an
AMD EPYC Zen 5). The signal part runs in a child process, so a crash is a failed test, not a dead test run."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import signal_stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack: Linux only")

SCENARIO = """
import gc, os, signal, sys, time
from pathlib import Path
from llmkiln.runtime import signal_stack
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

before = signal_stack.current()
runners = [OpenVinoPagedRunner(Path(sys.argv[1]), 2, 128, 32, 0, threads=1) for _ in range(2)]
for r in runners:  # first opened, first closed: not the reverse
    r.close()
del runners
gc.collect()
assert signal_stack.current() == before, (signal_stack.current(), before)
handled = []
signal.signal(signal.SIGTERM, lambda *_: handled.append(1))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
assert handled
print("handled")
"""


def test_runners_closed_first_to_last_leave_the_signal_stack_and_signals_work(engine_factory):
    xml = EngineDir(engine_factory("stories-ov-fp32")).openvino_model()
    assert xml is not None
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(xml)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0 and "handled" in out.stdout, (out.returncode, out.stderr[-2000:])


def test_kept_puts_back_the_stack_the_body_replaced():
    before = signal_stack.current()
    assert before is not None
    buf = ctypes.create_string_buffer(64 * 1024)
    with signal_stack.kept():
        signal_stack._set((ctypes.addressof(buf), 0, len(buf)))
        assert signal_stack.current() == (ctypes.addressof(buf), 0, len(buf))
    assert signal_stack.current() == before
