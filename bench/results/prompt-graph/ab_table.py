"""The in-process A/B table of bench/results/prompt-graph/README.md from inproc-ab/*.json (ENGINE-on|off-rK.json)."""

import json
import pathlib
import sys

here = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "inproc-ab")
runs: dict[tuple[str, str, str], dict[int, dict]] = {}
for f in sorted(here.glob("*.json")):
    engine, mode, rnd = f.stem.rsplit("-", 2)
    runs[(engine, mode, rnd)] = {lv["concurrency"]: lv for lv in json.loads(f.read_text())["levels"]}


def cells(lv: dict) -> tuple[float, ...]:
    t, i = lv["ttft_ms"], lv["itl_ms"]
    return lv["output_token_throughput"], t["p50"], t["p95"], i["p50"], i["p99"]


print(
    "| engine | c | round | off: tok/s, TTFT p50 / p95, ITL p50 / p99 | on | on ÷ off tok/s | TTFT p50 | ITL p99 |"
)
print("|---|---:|---|---|---|---:|---:|---:|")
for engine, _mode, rnd in sorted(k for k in runs if k[1] == "off"):
    for c, lv in sorted(runs[(engine, "off", rnd)].items()):
        a, b = cells(lv), cells(runs[(engine, "on", rnd)][c])
        fmt = "{:.0f}, {:.0f} / {:.0f}, {:.1f} / {:.0f}"
        print(
            f"| {engine} | {c} | {rnd} | {fmt.format(*a)} | {fmt.format(*b)} | **{b[0] / a[0]:.2f}** | "
            f"{b[1] / a[1]:.2f} | {b[4] / a[4]:.2f} |"
        )
