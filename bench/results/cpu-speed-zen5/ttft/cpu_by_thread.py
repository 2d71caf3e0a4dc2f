"""CPU time by process and thread while a served benchmark runs, counted only in the seconds when the engine
worker is busy (more than 1.2 cores), so start-up and warm-up do not count:

    python bench/results/cpu-speed-zen5/ttft/cpu_by_thread.py python -m experiments.cpu_peers --out OUT \
        --recipes bench-ov-fp32,bench-ov-bf16 --systems bench-ov-bf16/dynamo --user-tokens 80-120 \
        --set scheduler.max_batch_size=32 --concurrency 8 --requests 256 --warmup 16 --output-spread 16

Processes: the llmkiln Dynamo worker (`worker`: the engine's compute threads, its event loop, Dynamo's runtime),
Dynamo's frontend, and the benchmark process (`cpu_peers`: the client and llmkiln's OpenAI front, which runs in
the launcher); threads as /proc names them (`/main`: the process's main thread). Besides CPU seconds: context
switches a busy second per process, and per thread its wake-ups (voluntary switches: it slept) and preemptions
(involuntary: another thread took its core)."""

import collections
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def tag_of(cmd: str) -> str | None:
    # llmkiln's worker, or GenAI's (cpu_peers' RECIPE/ovgenai-dynamo)
    if "dynamo.worker" in cmd or "ovgenai_dynamo_worker" in cmd:
        return "worker"
    if "dynamo.frontend" in cmd:
        return "frontend"
    if "cpu_peers" in cmd:
        return "cpu_peers"
    return None


Thread = tuple[str, str]  # (process tag, thread name)
COUNTS = ("cpu", "wake-ups", "preempted")  # CPU seconds, voluntary and involuntary context switches


def snapshot() -> dict[str, dict[Thread, float]]:
    """Per count (COUNTS) and thread, the total so far: CPU seconds, voluntary context switches (it slept: a
    wake-up each) and involuntary ones (another thread took its core)."""
    out: dict[str, dict[Thread, float]] = {c: {} for c in COUNTS}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                tag = tag_of(f.read().replace(b"\0", b" ").decode())
            if tag is None:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                thread = (tag, comm + ("/main" if tid == pid else f"/{tid}"))
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
                out["cpu"][thread] = (int(fields[11]) + int(fields[12])) / HZ
                out["wake-ups"][thread] = int(status["voluntary_ctxt_switches"])
                out["preempted"][thread] = int(status["nonvoluntary_ctxt_switches"])
        except (OSError, ValueError, KeyError):
            continue
    return out


def main() -> None:
    proc = subprocess.Popen(sys.argv[1:])
    prev, busy = snapshot(), 0.0
    total: dict[str, collections.Counter[Thread]] = {c: collections.Counter() for c in COUNTS}
    while proc.poll() is None:
        time.sleep(1.0)
        cur = snapshot()
        delta = {c: {k: v - prev[c].get(k, v) for k, v in cur[c].items()} for c in COUNTS}
        if sum(v for (tag, _), v in delta["cpu"].items() if tag == "worker") > 1.2:
            busy += 1.0
            for c in COUNTS:
                total[c].update(delta[c])
        prev = cur
    per_s = max(busy, 1)
    print(f"busy seconds {busy:.0f}")
    by_process: dict[str, collections.Counter[str]] = {c: collections.Counter() for c in COUNTS}
    for c in COUNTS:
        for (tag, _), v in total[c].items():
            by_process[c][tag] += v
    for tag, v in by_process["cpu"].most_common():
        switches = by_process["wake-ups"][tag] + by_process["preempted"][tag]
        print(f"{tag:10s} {v:7.1f} s = {v / per_s:.2f} cores, {switches / per_s:7.0f} switches/s")
    for thread, v in total["cpu"].most_common(20):
        wake, pre = total["wake-ups"][thread] / per_s, total["preempted"][thread] / per_s
        print(f"   {thread[0]:10s} {thread[1]:24s} {v:7.1f} s  {wake:6.0f} wake-ups/s {pre:5.0f} preempted/s")


if __name__ == "__main__":
    main()
