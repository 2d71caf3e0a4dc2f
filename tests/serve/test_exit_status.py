"""llmkiln.serve.exit_status: a dead process's signal and, from its log, the step and stack it died in — read
from a real faulthandler report of a process killed by SIGFPE."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from llmkiln.serve.exit_status import crash_excerpt, describe_exit

CRASHER = textwrap.dedent(
    """
    import faulthandler, os, signal, threading, time
    faulthandler.enable(all_threads=True)
    print("llmkiln: engine host starting", flush=True)
    print("llmkiln: loading engine /engines/bench-ov-bf16 on Intel(R) Xeon(R) Processor (amx, 1 core(s))", flush=True)
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    def compile_model():
        os.kill(os.getpid(), signal.SIGFPE)
    compile_model()
    """
)


def test_exit_codes_and_signals_are_named():
    assert describe_exit(None) == "still running"
    assert describe_exit(0) == "exit code 0" and describe_exit(3) == "exit code 3"
    assert describe_exit(-8) == "killed by SIGFPE (signal 8)"
    assert describe_exit(-11) == "killed by SIGSEGV (signal 11)"
    assert describe_exit(-200) == "killed by signal 200"


def test_a_native_crash_reports_the_signal_the_step_and_the_stack():
    r = subprocess.run(
        [sys.executable, "-c", CRASHER], capture_output=True, text=True, timeout=60, check=False
    )
    assert describe_exit(r.returncode) == "killed by SIGFPE (signal 8)"
    lines = (r.stdout + r.stderr).splitlines()
    text = crash_excerpt(lines)
    first, fatal, *stack = text.splitlines()
    assert (
        first
        == "last step: llmkiln: loading engine /engines/bench-ov-bf16 on Intel(R) Xeon(R) Processor (amx, 1 core(s))"
    )
    assert fatal == "Fatal Python error: Floating point exception"
    assert stack[0].startswith("Current thread")  # the crashing thread's stack, not the sleeper's
    assert "in compile_model" in stack[1] and "in <module>" in stack[2]


def test_a_log_without_a_crash_has_no_excerpt():
    assert crash_excerpt(["llmkiln: loaded", "ready"]) == ""
