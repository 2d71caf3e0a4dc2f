#!/bin/bash
# A/B of the benchmark client: main's httpx client (checkout /work/main) against a checkout with
# aiohttp-client-tried.patch applied (/work/dev), bench-cpu-peers' workload at c=8 x 256, rounds in alternating order.
#   bash client_ab.sh OUT ROUNDS ENGINE
OUT=$1; R=$2; E=$3
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="main dev"; else order="dev main"; fi
  for arm in $order; do
    d=$OUT/$arm-r$k; mkdir -p $d
    (cd /work/$arm && PYTHONPATH=/work/$arm /work/main/.venv/bin/python -m experiments.cpu_peers --out $d --engines-dir /work/main/engines --recipes ${E/bf16/fp32},$E --systems $E/dynamo --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8 --requests 256 --warmup 16 --output-spread 16 > $d/log 2>&1)
    echo "$arm r$k: $(grep -E '^ *8 ' $d/log | awk '{print "ttft50="$3" ttft95="$4" itl50="$7" tok/s="$11}')"
  done
done
