#!/bin/bash
# Served A/B of the front's tokenizing, on a checkout with pretokenized-prompts-tried.patch applied: arms "text"
# (as served), "ids" (LLMKILN_X_IDS: prompts sent as token ids tokenized before the run), "nopar"
# (TOKENIZERS_PARALLELISM=false); bench-cpu-peers' workload at c=8 x 256, arm order reversed every other round.
#   bash tokenize_ab.sh OUT ROUNDS ENGINE ARM...
OUT=$1; R=$2; E=$3; shift 3
arms="$@"
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="$arms"; else order=$(echo $arms | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for arm in $order; do
    d=$OUT/$arm-r$k; mkdir -p $d
    x=""; p=""
    [ $arm = ids ] && x=/work/main/engines/$E/tokenizer.json
    [ $arm = nopar ] && p=false
    (cd /work/dev && env ${p:+TOKENIZERS_PARALLELISM=$p} LLMKILN_X_IDS=$x PYTHONPATH=/work/dev /work/main/.venv/bin/python -m experiments.cpu_peers --out $d --engines-dir /work/main/engines --recipes ${E/bf16/fp32},$E --systems $E/dynamo --user-tokens 80-120 --set scheduler.max_batch_size=32 --concurrency 8 --requests 256 --warmup 16 --output-spread 16 > $d/log 2>&1)
    echo "$arm r$k: $(grep -E '^ *8 ' $d/log | awk '{print "ttft50="$3" ttft95="$4" itl50="$7" tok/s="$11" cached="$12}')"
  done
done
