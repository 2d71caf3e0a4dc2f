#!/bin/bash
# In-process A/B of two checkouts with OpenVINO GenAI in-process between them (README.md, "In-process"):
#   bash bench/results/cpu-speed-zen5/op-balance/inprocess_ab.sh OUT ROUNDS [ENGINE]   ($A / $B: the checkouts)
# bench-cpu-peers' workload, c=8 x 64 and c=32 x 128 requests; rounds in reversed order every other round.
set -uo pipefail
OUT=$1; R=$2; E=${3:-bench-ov-bf16}; FP=${E/bf16/fp32}
A=${A:-/work/main}; B=${B:-/work/dev}
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
SIZES=(--user-tokens 80-120 --concurrency 8,32 --requests 64,128 --warmup 16 --output-spread 16)
for ((k = 1; k <= R; k++)); do
  if ((k % 2)); then order="main dev genai"; else order="genai dev main"; fi
  for c in $order; do
    d=$OUT/$c-r$k; mkdir -p "$d"
    case $c in
      genai) (cd "$B" && PYTHONPATH=$B "$PY" -m experiments.cpu_peer_openvino_genai --out "$d" --engines-dir "$ENGINES" \
                --engine "$FP" --precisions bf16 --max-num-seqs 32 "${SIZES[@]}" > "$d/log" 2>&1) ;;
      main | dev) src=$([ "$c" = main ] && echo "$A" || echo "$B")
        (cd "$src" && PYTHONPATH=$src "$PY" -m experiments.cpu_peer_llmkiln_inprocess --out "$d" --engines-dir "$ENGINES" \
          --engine "$E" --set scheduler.max_batch_size=32 "${SIZES[@]}" > "$d/log" 2>&1) ;;
    esac
  done
done
