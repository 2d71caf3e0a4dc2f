"""What a dead process's exit code and log say: the signal that killed it and what it was doing.

Workers and Triton stubs enable `faulthandler`, so a native crash (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL)
leaves "Fatal Python error: <what>" and the Python stacks in the log; the host logs an `llmkiln:` line before
each long native step (loading an engine names the engine and the CPU). A launcher reports both instead of a
bare "exit code -8".
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

FATAL = "Fatal Python error:"
STEP_MARK = "llmkiln:"
STACK_LINES = 12  # of the crashing thread's stack


def describe_exit(code: int | None) -> str:
    """'exit code 3', 'killed by SIGFPE (signal 8)', 'still running'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        else:
            name = f"{name} (signal {-code})"
        return f"killed by {name}"
    return f"exit code {code}"


def crash_excerpt(lines: Sequence[str]) -> str:
    """The last `llmkiln:` line before the crash and faulthandler's report (the fatal error and the crashing
    thread's innermost frames); "" when the log holds no such report."""
    at = next((i for i in range(len(lines) - 1, -1, -1) if FATAL in lines[i]), None)
    if at is None:
        return ""
    step = next((lines[i] for i in range(at - 1, -1, -1) if STEP_MARK in lines[i]), None)
    out = [f"last step: {step.strip()}"] if step else []
    out.append(lines[at].strip())
    rest = [line.strip() for line in lines[at + 1 :]]
    heads = [i for i, text in enumerate(rest) if text.startswith(("Current thread", "Thread "))]
    head = next((i for i in heads if rest[i].startswith("Current thread")), heads[0] if heads else None)
    stack: list[str] = []
    if head is not None:
        stack.append(rest[head])
        for text in rest[head + 1 :]:
            if not text.startswith("File "):
                break
            stack.append(text)
    out += stack[: STACK_LINES + 1]
    return "\n".join(out)
