"""The CPU priority of an engine's compute: `normal`, or `idle` (Linux SCHED_IDLE: the thread runs only on cores
no other thread wants, and yields them at once).

Where it is used: prefill/decode separation on one CPU host with `kiln serve --dynamo --decode-first`. The decode
tier runs on every core and its steps, the front door and the KV transfers preempt the prefill tier's compute at
once; the prefill tier takes the cycles they leave. A GPU host has no use for it (each tier has its devices).

It applies to the engine's scheduler thread, where onnxruntime computes with one intra-op thread and where
OpenVINO's infer requests are issued; threads a library started before (onnxruntime's extra intra-op threads,
created when the session is) keep theirs. Lowering a thread's priority needs no privilege; raising it back would.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from llmkiln.errors import BadInput

ComputePriority = Literal["normal", "idle"]
COMPUTE_PRIORITIES: tuple[str, ...] = get_args(ComputePriority)


def check(priority: str) -> ComputePriority:
    """The priority, or BadInput naming the flag's values (and the platform when it lacks SCHED_IDLE)."""
    if priority not in COMPUTE_PRIORITIES:
        raise BadInput(f"--compute-priority {priority!r}: choose one of {', '.join(COMPUTE_PRIORITIES)}")
    if priority == "idle" and not hasattr(os, "SCHED_IDLE"):
        raise BadInput("--compute-priority idle needs Linux (SCHED_IDLE); use normal here")
    return priority  # type: ignore[return-value]


def apply_to_this_thread(priority: ComputePriority) -> None:
    """Give the calling thread this priority (normal: leave it as it is)."""
    if priority == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
