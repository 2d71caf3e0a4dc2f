#!/bin/bash
# Steps under two checkouts' code in turn (README.md, "Steps"):
#   bash bench/results/cpu-speed-zen5/op-balance/ab.sh ENGINE ROUNDS OUT.jsonl [A_CHECKOUT] [B_CHECKOUT]
# (defaults /work/main and /work/dev); rounds alternate the order; prints each shape's medians and B / A per round.
set -euo pipefail
E=$1; R=$2; OUT=$3; A=${4:-/work/main}; B=${5:-/work/dev}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
: > "$OUT"
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="$A $B"; else order="$B $A"; fi
  for c in $order; do
    res=$(PYTHONPATH=$c "$PY" "$HERE/step_probe.py" "$ENGINES/$E" 2>/dev/null | tail -1)
    code=$([ "$c" = "$A" ] && echo main || echo dev)
    echo "{\"code\": \"$code\", \"round\": $k, \"ms\": $res}" >> "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for s in rows[0]["ms"]:
    a = [r["ms"][s] for r in rows if r["code"] == "main"]
    b = [r["ms"][s] for r in rows if r["code"] == "dev"]
    ratios = [y / x for x, y in zip(a, b)]
    print(f"{s:20s} A {statistics.median(a):6.1f}  B {statistics.median(b):6.1f}  B/A median {statistics.median(ratios):.3f}")
PY
