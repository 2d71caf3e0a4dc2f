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


def snapshot() -> dict[tuple[str, str], float]:
    """(process tag, thread) -> CPU seconds so far; (process tag, "~" + thread) -> its context switches so far,
    voluntary (it slept: a wake-up each) and involuntary (it was preempted) together; ("vol" or "invol",
    "tag/thread") -> each kind alone."""
    out: dict[tuple[str, str], float] = {}
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
                name = comm + ("/main" if tid == pid else f"/{tid}")
                out[(tag, name)] = (int(fields[11]) + int(fields[12])) / HZ
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
                vol, invol = int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])
                out[(tag, "~" + name)] = vol + invol
                out[("vol", tag + "/" + name)] = vol
                out[("invol", tag + "/" + name)] = invol
        except (OSError, ValueError):
            continue
    return out


def main() -> None:
    proc = subprocess.Popen(sys.argv[1:])
    prev, total, busy = snapshot(), collections.Counter(), 0.0
    while proc.poll() is None:
        time.sleep(1.0)
        cur = snapshot()
        delta = {k: v - prev.get(k, v) for k, v in cur.items()}
        if sum(v for k, v in delta.items() if k[0] == "worker") > 1.2:
            busy += 1.0
            total.update(delta)
        prev = cur
    print(f"busy seconds {busy:.0f}")
    cpu = {k: v for k, v in total.items() if k[0] not in ("vol", "invol") and not k[1].startswith("~")}
    by_process, switches = collections.Counter(), collections.Counter()
    for (tag, _), v in cpu.items():
        by_process[tag] += v
    for (tag, name), v in total.items():
        if name.startswith("~"):
            switches[tag] += v
    for tag, v in by_process.most_common():
        print(
            f"{tag:10s} {v:7.1f} s = {v / max(busy, 1):.2f} cores, {switches[tag] / max(busy, 1):7.0f} switches/s"
        )
    for (tag, name), v in collections.Counter(cpu).most_common(20):
        vol, invol = total[("vol", f"{tag}/{name}")], total[("invol", f"{tag}/{name}")]
        print(
            f"   {tag:10s} {name:24s} {v:7.1f} s  {vol / max(busy, 1):6.0f} wake-ups/s {invol / max(busy, 1):5.0f} preempted/s"
        )


if __name__ == "__main__":
    main()
