"""Step times of the cascade graph, one run at a time, with and without noise.py processes beside them
(README.md "Contention"):

    PYTHONPATH=. python bench/results/cpu-speed-zen5/ttft/contention/noise_probe.py engines/bench-ov-bf16 \
        0.2:1:1:0 0.2:1:1:n10 0.2:1:1:n19 0.2:1:1:idle 0.1:0.5:2:0

Each noise argument BUSY_MS:SLEEP_MS:PROCESSES:PRIORITY (0, n10 / n19: nice 10 / 19, idle: SCHED_IDLE); three
rounds, each the median of 15 runs per shape, printed as one JSON object."""

import json
import subprocess
import sys
import time
from pathlib import Path

from experiments.shared_prefix_runs import PAST, median_run_ms, prefix_with_decoders
from experiments.shared_prefix_runs import token_ids as ids

NOISE = Path(__file__).with_name("noise.py")
PRIORITY = {"0": [], "n10": ["nice", "-n", "10"], "n19": ["nice", "-n", "19"], "idle": ["chrt", "-i", "0"]}


def main() -> None:
    r, tables, turn = prefix_with_decoders(Path(sys.argv[1]), 8, 40)
    dec = [(f"s{i}", (5 + i,), PAST + 40, tables[i]) for i in range(8)]
    plans = {"8 decodes": dec, "7 dec + 100": [*dec[:7], ("t", ids(r, 400, 100), PAST, turn)]}
    noises = [None, *(tuple(a.split(":")) for a in sys.argv[2:])]
    out: dict[str, list[float]] = {}
    for _ in range(3):
        for nz in noises:
            procs = []
            if nz:
                busy, sleep, n, pri = nz
                cmd = [*PRIORITY[pri], sys.executable, str(NOISE), busy, sleep]
                procs = [subprocess.Popen(cmd) for _ in range(int(n))]
                time.sleep(0.3)
            for name, plan in plans.items():
                out.setdefault(f"{name} noise={':'.join(nz) if nz else 'none'}", []).append(
                    round(median_run_ms(r, plan), 1)
                )
            for p in procs:
                p.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
