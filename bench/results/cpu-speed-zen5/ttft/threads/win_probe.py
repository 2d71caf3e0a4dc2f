import json
import pathlib
import sys
import time

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)


def dec(n):
    return decodes_on(tables, n, 40)


def run(plan):
    r._run(plan, [1] * len(plan), cascade=True)


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec(7)
for _ in range(5):
    run(dec(7))
    run(mixed)
open("/tmp/s17/ready", "w").write("1")
time.sleep(1.0)
wins = {"after_mixed": [], "after_dec": []}
t_end = time.monotonic() + 9
while time.monotonic() < t_end:
    run(mixed)
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    run(dec(7))
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    wins["after_mixed"].append((a, b))
    run(dec(7))
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    run(dec(7))
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    wins["after_dec"].append((a, b))
json.dump(wins, open("/tmp/s17/wins.json", "w"))
print({k: sum(b - a for a, b in v) / len(v) / 1e6 for k, v in wins.items()})
