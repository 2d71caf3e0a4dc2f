#!/bin/bash
# Served A/B: the start-up heap frozen after warmup (on, the default) or not (off): $LLMKILN_GC_FREEZE.
#   bash ab.sh OUT ROUNDS ENGINE...
set -uo pipefail
OUT=$1; R=$2; shift 2
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="off on"; else order="on off"; fi
  for e in "$@"; do
    fp=${e/bf16/fp32}
    for arm in $order; do
      d=$OUT/$e/$arm-r$k; mkdir -p "$d"
      x=0; [ "$arm" = on ] && x=1
      LLMKILN_GC_FREEZE=$x "$PY" -m experiments.cpu_peers --out "$d" --engines-dir "$ENGINES" --recipes "$fp,$e" \
        --systems "$e/dynamo" --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8,32 \
        --requests 128,128 --warmup 16 --output-spread 16 > "$d/log" 2>&1
      echo "$e $arm r$k: $(grep -E '^ *(8|32) ' "$d/log" | awk '{print "c="$1" ttft50="$3" ttft95="$4" ttft99="$5" tok/s="$11}' | tr '\n' ' ')"
    done
  done
done
