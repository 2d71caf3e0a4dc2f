"""A stand-in for the serving chain's bursts of work: busy BUSY_MS, then asleep SLEEP_MS, forever.

python noise.py BUSY_MS SLEEP_MS"""

import sys
import time

busy, sleep = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
while True:
    time.sleep(sleep)
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
