#!/usr/bin/env bash
# The CPU-speed issue's target table in one run: llmkiln's OpenVINO engines served (`kiln serve --dynamo`, fp32
# and bf16), vLLM's CPU build (fp32, bf16), OpenVINO GenAI bf16 in-process and served through the same front door
# (cpu_peers' RECIPE/ovgenai-dynamo) and llmkiln's runtime in-process (engine against engine), on one model, two
# workloads (bench-cpu-peers' 80-120-token user turns and short 30-40-token turns, both after one 1500-token
# system prompt, 32 ± 16 output tokens), closed loop at c=8 and c=32 (64 and 128 requests,
# max_batch_size / max-num-seqs 32 for every system), in ROUNDS rounds with the systems' order reversed every other
# round (this VM's speed drifts by ±10-40% from minute to minute: a slow minute must not land on one system only).
#
#   bash scripts/cpu_speed_targets.sh OUT [bench|smollm2] [ROUNDS] [WORKLOADS]
#
# INT8=1 adds the bf16 recipe with int8 weights (<bf16 recipe>-int8, built beforehand: `kiln build`), served and
# in-process: the best precision on a CPU without AMX (docs/cpu-engine.md "int8 weights").
# OUT/<model>-<workload>/round-K/ holds each round's cpu_peers result (SUMMARY.md, summary.json, one report per
# system); `python -m experiments.cpu_speed_targets OUT` writes OUT/SUMMARY.md from them (means over rounds and the
# targets, each ratio taken within a round). About 12 minutes a round per model on 2 idle cores.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${1:?usage: cpu_speed_targets.sh OUT [bench|smollm2] [ROUNDS] [WORKLOADS]}
MODEL=${2:-bench}
ROUNDS=${3:-2}
WORKLOADS=${4:-peers,short}
PY=${PYTHON:-.venv/bin/python}
ENGINES=${ENGINES:-engines}
case "$MODEL" in
  bench) FP32=bench-ov-fp32 BF16=bench-ov-bf16 ;;
  smollm2) FP32=smollm2-ov-fp32 BF16=smollm2-ov-bf16 ;;
  *) echo "cpu_speed_targets.sh: model $MODEL: expected bench or smollm2" >&2; exit 2 ;;
esac
if [[ "${INT8:-0}" == 1 && ! -f "$ENGINES/$BF16-int8/manifest.json" ]]; then
  echo "cpu_speed_targets.sh: INT8=1 needs the engine $ENGINES/$BF16-int8: kiln build $BF16-int8 --engines-dir $ENGINES" >&2
  exit 2
fi
bash scripts/vllm_cpu_env.sh >/dev/null
bash scripts/openvino_genai_env.sh >/dev/null
SIZES=(--concurrency 8,32 --requests 64,128 --warmup 16 --output-spread 16)
SET=(--set scheduler.max_batch_size=32)
RECIPES="$FP32,$BF16" INT8_SERVED=() INT8_INPROC=()
if [[ "${INT8:-0}" == 1 ]]; then
  RECIPES="$RECIPES,$BF16-int8" INT8_SERVED=("$BF16-int8/dynamo") INT8_INPROC=(inproc-int8)
fi
order=("$FP32/dynamo" "$BF16/dynamo" "${INT8_SERVED[@]}" vllm-fp32 vllm-bf16 ovgenai-bf16 "$BF16/ovgenai-dynamo"
  inproc-bf16 "${INT8_INPROC[@]}")
for wl in ${WORKLOADS//,/ }; do
  case "$wl" in
    peers) USER_TOKENS=80-120 ;;
    short) USER_TOKENS=30-40 ;;
    *) echo "cpu_speed_targets.sh: workload $wl: expected peers or short" >&2; exit 2 ;;
  esac
  for ((k = 1; k <= ROUNDS; k++)); do
    dir="$OUT/$MODEL-$wl/round-$k"
    mkdir -p "$dir"
    systems=("${order[@]}")
    if ((k % 2 == 0)); then
      systems=()
      for ((i = ${#order[@]} - 1; i >= 0; i--)); do systems+=("${order[$i]}"); done
    fi
    echo "== $MODEL $wl round $k: ${systems[*]}" >&2
    for s in "${systems[@]}"; do
      case "$s" in
        ovgenai-bf16)
          "$PY" -m experiments.cpu_peer_openvino_genai --out "$dir" --engines-dir "$ENGINES" --engine "$FP32" \
            --precisions bf16 --user-tokens "$USER_TOKENS" --max-num-seqs 32 "${SIZES[@]}" ;;
        inproc-bf16 | inproc-int8)
          engine=$BF16; [[ "$s" == inproc-int8 ]] && engine=$BF16-int8
          "$PY" -m experiments.cpu_peer_llmkiln_inprocess --out "$dir" --engines-dir "$ENGINES" --engine "$engine" \
            --user-tokens "$USER_TOKENS" "${SET[@]}" "${SIZES[@]}" ;;
        *)
          "$PY" -m experiments.cpu_peers --out "$dir" --engines-dir "$ENGINES" --recipes "$RECIPES" \
            --systems "$s" --keep --user-tokens "$USER_TOKENS" "${SET[@]}" "${SIZES[@]}" ;;
      esac
    done
  done
done
echo "$OUT" >&2
