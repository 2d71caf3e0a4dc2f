#!/bin/bash
# Served A/B of an idle gap after every engine step (step-gap-tried.patch applied: LLMKILN_X_GAP_US), arms in
# microseconds (0 = as is); bench-cpu-peers' workload at c=8 x 256, arm order reversed every other round.
#   bash step_gap_ab.sh OUT ROUNDS ENGINE GAP_US...
OUT=$1; R=$2; E=$3; shift 3
arms="$@"
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="$arms"; else order=$(echo $arms | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for arm in $order; do
    d=$OUT/gap$arm-r$k; mkdir -p $d
    (cd /work/dev && LLMKILN_X_GAP_US=$arm PYTHONPATH=/work/dev /work/main/.venv/bin/python -m experiments.cpu_peers --out $d --engines-dir /work/main/engines --recipes ${E/bf16/fp32},$E --systems $E/dynamo --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8 --requests 256 --warmup 16 --output-spread 16 > $d/log 2>&1)
    echo "gap$arm r$k: $(grep -E '^ *8 ' $d/log | awk '{print "ttft50="$3" ttft95="$4" itl50="$7" tok/s="$11}')"
  done
done
