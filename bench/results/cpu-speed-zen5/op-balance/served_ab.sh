#!/bin/bash
# Served A/B of two checkouts (README.md, "Served"): bench-cpu-peers' workload through `kiln serve --dynamo`
# started from each checkout in turn, c=8 and c=32 x 128 requests, rounds in alternating order.
#   bash bench/results/cpu-speed-zen5/op-balance/served_ab.sh OUT ROUNDS ENGINE...   ($A / $B: the checkouts)
set -uo pipefail
OUT=$1; R=$2; shift 2
A=${A:-/work/main}; B=${B:-/work/dev}
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="$A $B"; else order="$B $A"; fi
  for e in "$@"; do
    fp=${e/bf16/fp32}
    for c in $order; do
      d=$OUT/$e/$(basename "$c")-r$k; mkdir -p "$d"
      (cd "$c" && PYTHONPATH=$c "$PY" -m experiments.cpu_peers --out "$d" --engines-dir "$ENGINES" --recipes "$fp,$e" \
        --systems "$e/dynamo" --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8,32 \
        --requests 128,128 --warmup 16 --output-spread 16 > "$d/log" 2>&1)
      echo "$e $(basename "$c") r$k: $(grep -E '^ *(8|32) ' "$d/log" | awk '{print "c="$1" ttft50="$3" ttft95="$4" tok/s="$11}' | tr '\n' ' ')"
    done
  done
done
