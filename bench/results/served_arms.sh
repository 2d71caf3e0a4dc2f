#!/bin/bash
# Served A/B (or A/B/C...) rounds: bench-cpu-peers' workload (1500-token system prompt + 80-120-token turns,
# 32 +- 16 out) through `kiln serve --dynamo` (experiments.cpu_peers) once per arm and engine, the arms' order
# reversed every other round; one line per run: TTFT p50 / p95, ITL p50 and tokens/s per level.
#
#   bash bench/results/served_arms.sh OUT ROUNDS "ENGINE..." ARM...
#
# An ARM is NAME[:SETTING...]; a SETTING is VAR=VALUE (an environment variable of the run) or checkout=DIR (run
# that checkout's code; default: this one). Levels: $LEVELS (default 8,32) x $REQUESTS (default 128,128).
# Runs land in OUT/ENGINE/NAME-rK/ (log, SUMMARY.md, raw/). Examples, as this folder's READMEs ran them:
#   gc-freeze/:          served_arms.sh OUT 4 "bench-ov-bf16 smollm2-ov-bf16" off:LLMKILN_GC_FREEZE=0 on:LLMKILN_GC_FREEZE=1
#   op-balance/:         served_arms.sh OUT 3 "bench-ov-bf16 smollm2-ov-bf16" main:checkout=/work/main dev:checkout=/work/dev
#   bench-client/:       LEVELS=8 REQUESTS=256 served_arms.sh OUT 7 bench-ov-bf16 main:checkout=/work/main dev:checkout=/work/dev
#   contention/ (gap):   LEVELS=8 REQUESTS=256 served_arms.sh OUT 4 bench-ov-bf16 gap0 gap300:LLMKILN_X_GAP_US=300 ...
set -uo pipefail
OUT=$1; R=$2; ENGINES_LIST=$3; shift 3
ARMS=("$@")
PY=${PYTHON:-/work/main/.venv/bin/python}
ENGINES=${ENGINES:-/work/main/engines}
LEVELS=${LEVELS:-8,32}
REQUESTS=${REQUESTS:-128,128}
HERE=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
for ((k = 1; k <= R; k++)); do
  order=("${ARMS[@]}")
  if ((k % 2 == 0)); then
    order=(); for ((i = ${#ARMS[@]} - 1; i >= 0; i--)); do order+=("${ARMS[i]}"); done
  fi
  for e in $ENGINES_LIST; do
    fp=${e/bf16/fp32}
    for arm in "${order[@]}"; do
      IFS=: read -r -a parts <<< "$arm"
      name=${parts[0]}; checkout=$HERE; vars=()
      for s in "${parts[@]:1}"; do
        case "$s" in
          checkout=*) checkout=${s#checkout=} ;;
          *=*) vars+=("$s") ;;
          *) echo "served_arms.sh: arm $arm: setting '$s' is neither VAR=VALUE nor checkout=DIR" >&2; exit 2 ;;
        esac
      done
      d=$OUT/$e/$name-r$k; mkdir -p "$d"
      (cd "$checkout" && env "${vars[@]}" PYTHONPATH="$checkout" "$PY" -m experiments.cpu_peers --out "$d" \
        --engines-dir "$ENGINES" --recipes "$fp,$e" --systems "$e/dynamo" --user-tokens 80-120 \
        --set scheduler.max_batch_size=32 --concurrency "$LEVELS" --requests "$REQUESTS" --warmup 16 \
        --output-spread 16 > "$d/log" 2>&1)
      echo "$e $name r$k: $(grep -E '^ *[0-9]+ +[0-9]+/[0-9]+ ' "$d/log" \
        | awk '{print "c="$1" ttft50="$3" ttft95="$4" itl50="$7" tok/s="$11}' | tr '\n' ' ')"
    done
  done
done
