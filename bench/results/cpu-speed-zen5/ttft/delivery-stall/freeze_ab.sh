#!/bin/bash
# Paired rounds, the benchmark process's collector frozen before each level or not (README.md): needs
# freeze-tried.patch applied in CHECKOUT (default /work/dev) and gc_log_sitecustomize.py copied as
# /tmp/gcsc/sitecustomize.py (mkdir -p /tmp/gcsite); engines from /work/main/engines.
cd "${CHECKOUT:-/work/dev}"
for k in 1 2 3 4 5; do
  if ((k % 2)); then order="0 1"; else order="1 0"; fi
  for f in $order; do
    rm -f /tmp/gcsite/gc-*.log
    LLMKILN_X_BENCH_FREEZE=$f PYTHONPATH=/tmp/gcsc:. timeout 900 /work/main/.venv/bin/python -m experiments.cpu_peers --out /tmp/gcab-$f-$k --recipes bench-ov-bf16 --systems bench-ov-bf16/dynamo --user-tokens 30-40 --set scheduler.max_batch_size=32 --concurrency 8 --requests 64 --warmup 16 --output-spread 16 --engines-dir /work/main/engines > /tmp/gcab-$f-$k.log 2>&1
    bp=$(ls /tmp/gcsite/gc-*.log | head -1)
    echo "freeze=$f round=$k $(grep 'c=8:' /tmp/gcab-$f-$k.log) | bench-process gen2: $(awk '$2==2{printf "%s ms (%s obj); ", $3, $5}' $bp)"
  done
done
