#!/usr/bin/env bash
# GPU verification of llmkiln's TensorRT-LLM path: what a GPU host runs after deploying this checkout.
#
# Run it inside the pinned container (llmkiln/trtllm/pins.json: nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3)
# with this checkout mounted at the same path as on the host that built the CPU half:
#
#   docker run --rm --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 --net host \
#     -v $PWD:$PWD -w $PWD nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3 scripts/gpu_verify.sh
#
# Before it, on the CPU host (or anywhere with `make setup`): make engine RECIPE=tiny-trtllm-fp8 (stops with exit
# 3 and a plan) and make engine RECIPE=tiny-trtllm-llmapi (exit 0). Then this script, for each path:
#   1. checks tensorrt_llm / tensorrt versions and the GPU's compute capability against the pins (exit 3 if not);
#   2. engine path: kiln build --resume (trtllm-build of the smoke engine, the container's model files compared
#      and taken); LLM-API path: compares and takes the llmapi model files (kiln repo --check --take-model-files);
#   3. starts tritonserver on 127.0.0.1, waits for READY (the recipe's warmup prefixes run before it);
#   4. probes: the first request with the warmup prefix must reuse KV blocks (warmup ran before READY), a fresh
#      long shared prefix sent twice must reuse KV blocks on the second request (kv_cache_reused_block(s));
#      cold vs warm time to first token and the machine go to bench/results/gpu/.
# Nothing is installed into the container's Python: kiln runs from a venv on the mounted checkout that sees the
# container's packages (--system-site-packages). Exit 0 only when every check passed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGINES=${LLMKILN_ENGINES:-$ROOT/engines}
RESULTS=${LLMKILN_GPU_RESULTS:-$ROOT/bench/results/gpu}
VENV=${LLMKILN_GPU_VENV:-$ROOT/.venv-gpu}
PATHS=${1:-engine llmapi}
HTTP_PORT=${LLMKILN_HTTP_PORT:-18000}
ROUNDS=${LLMKILN_PROBE_ROUNDS:-5}

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit "${2:-1}"; }

say "kiln in $VENV (system site packages: the container's tensorrt_llm, torch, transformers)"
if [ ! -x "$VENV/bin/kiln" ]; then
  python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install --quiet --no-deps -e "$ROOT"
  "$VENV/bin/pip" install --quiet 'click==8.5.1' 'rich==15.0.0' 'tritonclient[grpc,http]==2.73.0'
fi
KILN="$VENV/bin/kiln"
PY="$VENV/bin/python"

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

serve_and_probe() {  # $1 repository, $2 kind (engine|llmapi), $3 recipe
  local log="$RESULTS/tritonserver-$3.log"
  mkdir -p "$RESULTS"
  tritonserver --model-repository="$1" --http-address=127.0.0.1 --grpc-address=127.0.0.1 \
    --metrics-address=127.0.0.1 --http-port="$HTTP_PORT" --grpc-port=$((HTTP_PORT + 1)) \
    --metrics-port=$((HTTP_PORT + 2)) >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do  # loading + warmup; READY only after model_warmup has run
    if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null; then break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || fail "tritonserver exited; see $log"
    sleep 1
  done
  curl -sf "http://127.0.0.1:$HTTP_PORT/v2/health/ready" >/dev/null || fail "not READY after 600 s; see $log"
  "$PY" -m llmkiln.trtllm.smoke probe --url "http://127.0.0.1:$HTTP_PORT" --kind "$2" --recipe "$3" \
    --rounds "$ROUNDS" --out "$RESULTS"
  stop_server
}

for path in $PATHS; do
  case "$path" in
    engine)
      recipe=tiny-trtllm-fp8
      say "$recipe: versions and compute capability against the pins"
      "$PY" -m llmkiln.trtllm.smoke versions "$recipe"
      if [ ! -f "$ENGINES/$recipe/manifest.json" ]; then
        plan="$ENGINES/.pending/$recipe/plan.json"
        [ -f "$plan" ] || fail "no $plan: run 'make engine RECIPE=$recipe' first (CPU half)" 2
        say "$recipe: kiln build --resume (trtllm-build, container model files compared and taken)"
        "$KILN" build --resume "$plan"
      fi
      say "$recipe: serve and probe"
      serve_and_probe "$ENGINES/$recipe/triton_repo" engine "$recipe"
      ;;
    llmapi)
      recipe=tiny-trtllm-llmapi
      say "$recipe: versions and compute capability against the pins"
      "$PY" -m llmkiln.trtllm.smoke versions "$recipe"
      [ -f "$ENGINES/$recipe/manifest.json" ] || fail "no $ENGINES/$recipe: run 'make engine RECIPE=$recipe' first" 2
      say "$recipe: compare the container's llmapi model files, take model.py and helpers.py"
      "$KILN" repo --check "$ENGINES/$recipe/triton_repo" --take-model-files
      "$PY" - "$ENGINES/$recipe/llm_api_options.yaml" <<'EOF'
import sys, yaml
from tensorrt_llm.llmapi import TorchLlmArgs  # the installed generation: every key must be one of its fields
opts = yaml.safe_load(open(sys.argv[1]))
bad = sorted(set(opts) - set(TorchLlmArgs.model_fields))
sys.exit(f"llm_api_options.yaml keys unknown to the installed TensorRT-LLM: {bad}" if bad else 0)
EOF
      say "$recipe: serve and probe"
      serve_and_probe "$ENGINES/$recipe/triton_repo" llmapi "$recipe"
      ;;
    *) fail "unknown path '$path' (engine, llmapi)" 2 ;;
  esac
done
say "all GPU checks passed; results in $RESULTS"
