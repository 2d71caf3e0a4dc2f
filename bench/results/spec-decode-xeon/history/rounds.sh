#!/bin/bash
# The history rounds (README.md): each round H = llmkiln-ngram with --history-tokens 16384 beside GenAI's prompt
# lookup, N = llmkiln-ngram without the history; systems' and H/N order alternating. Run from the repository root:
#   OUT=/tmp/hist ROUNDS=6 SEED=0 bash bench/results/spec-decode-xeon/history/rounds.sh
# (PY: the main venv's python, ENGINES: the engines folder holding smollm2-ov-bf16)
OUT=${OUT:-/tmp/hist}
PY=${PY:-.venv/bin/python}
base="--engines-dir ${ENGINES:-engines} --concurrency 1 --requests 48 --warmup 8 --harness stepped --draft-len 8 --seed ${SEED:-0}"
for k in $(seq 1 "${ROUNDS:-6}"); do
  if [ $((k % 2)) = 1 ]; then sys=llmkiln-ngram,ovgenai-lookup; first=H; else sys=ovgenai-lookup,llmkiln-ngram; first=N; fi
  runH() { $PY -m experiments.spec_decode --out "$OUT/R$k-H" --systems $sys --history-tokens 16384 $base > "$OUT/R$k-H.log" 2>&1; }
  runN() { $PY -m experiments.spec_decode --out "$OUT/R$k-N" --systems llmkiln-ngram $base > "$OUT/R$k-N.log" 2>&1; }
  if [ $first = H ]; then runH; runN; else runN; runH; fi
  echo "round $k done $(date -u +%T)"
done
