#!/bin/bash
# history rounds: H = llmkiln-ngram with --history-tokens 16384 beside GenAI's lookup; N = llmkiln-ngram without
cd /work/dev
PY=/work/main/.venv/bin/python
base="--engines-dir /work/main/engines --concurrency 1 --requests 48 --warmup 8 --harness stepped --draft-len 8"
for k in 1 2 3 4 5 6; do
  if [ $((k % 2)) = 1 ]; then sys=llmkiln-ngram,ovgenai-lookup; first=H; else sys=ovgenai-lookup,llmkiln-ngram; first=N; fi
  runH() { date -u +%T; $PY -m experiments.spec_decode --out /tmp/hist/R$k-H --systems $sys --history-tokens 16384 $base > /tmp/hist/R$k-H.log 2>&1; }
  runN() { date -u +%T; $PY -m experiments.spec_decode --out /tmp/hist/R$k-N --systems llmkiln-ngram $base > /tmp/hist/R$k-N.log 2>&1; }
  if [ $first = H ]; then runH; runN; else runN; runH; fi
  echo "round $k done $(date -u +%T)"
done
