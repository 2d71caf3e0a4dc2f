#!/bin/bash
# Served A/B of an environment switch: bench-cpu-peers' workload through `kiln serve --dynamo` (cpu_peers,
# c=8 and c=32 x 128 requests) with $VAR=0 ("off") and $VAR=1 ("on") in turn, rounds in alternating order; one line
# per run: TTFT p50 / p95 / p99 and tokens/s per level. Used by gc-freeze/ (VAR=LLMKILN_GC_FREEZE) and
# cpu-speed-zen5/ttft/front-process/ (VAR=LLMKILN_X_FRONT_PROCESS, a switch of its patch; its log names the arms
# "in" and "child").
#   bash bench/results/served_switch_ab.sh VAR OUT ROUNDS ENGINE...
set -uo pipefail
VAR=$1; OUT=$2; R=$3; shift 3
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="off on"; else order="on off"; fi
  for e in "$@"; do
    fp=${e/bf16/fp32}
    for arm in $order; do
      d=$OUT/$e/$arm-r$k; mkdir -p "$d"
      x=0; [ "$arm" = on ] && x=1
      env "$VAR=$x" "$PY" -m experiments.cpu_peers --out "$d" --engines-dir "$ENGINES" --recipes "$fp,$e" \
        --systems "$e/dynamo" --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8,32 \
        --requests 128,128 --warmup 16 --output-spread 16 > "$d/log" 2>&1
      echo "$e $arm r$k: $(grep -E '^ *(8|32) ' "$d/log" | awk '{print "c="$1" ttft50="$3" ttft95="$4" ttft99="$5" tok/s="$11}' | tr '\n' ' ')"
    done
  done
done
