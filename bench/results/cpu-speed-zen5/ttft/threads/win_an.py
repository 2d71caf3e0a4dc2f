import bisect
import collections
import json
import subprocess

wins = json.load(open("/tmp/s17/wins.json"))
out = subprocess.run(
    ["perf", "script", "-i", "/tmp/s17/win.data", "-F", "tid,time,ip,sym,dso", "-G"],
    capture_output=True,
    text=True,
).stdout
iv = sorted([(a, b, k) for k, v in wins.items() for a, b in v])
starts = [x[0] for x in iv]
hist = {k: collections.Counter() for k in wins}
for line in out.splitlines():
    parts = line.split()
    if len(parts) < 4:
        continue
    tid = parts[0]
    t = float(parts[1].rstrip(":")) * 1e9
    i = bisect.bisect_right(starts, t) - 1
    if i < 0 or t > iv[i][1]:
        continue
    dso = parts[-1].strip("()").split("/")[-1]
    sym = " ".join(parts[3:-1])[:70]
    if "perf-" in dso:
        dso, sym = "JIT", ""
    hist[iv[i][2]][(tid, dso, sym)] += 1
n = {k: len(v) for k, v in wins.items()}
keys = set(hist["after_mixed"]) | set(hist["after_dec"])
rows = sorted(
    keys, key=lambda k: -(hist["after_mixed"][k] / n["after_mixed"] - hist["after_dec"][k] / n["after_dec"])
)
print("samples per run (4999 Hz: 0.2 ms each)", {k: sum(hist[k].values()) / n[k] for k in hist})
for k in rows[:25]:
    a, b = hist["after_mixed"][k] / n["after_mixed"], hist["after_dec"][k] / n["after_dec"]
    print(f"{a:6.2f} {b:6.2f} {a - b:+6.2f}  {k}")
