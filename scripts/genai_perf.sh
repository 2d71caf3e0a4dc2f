#!/usr/bin/env bash
# Profile a served llmkiln engine with NVIDIA genai-perf, unchanged, as for a tensorrtllm_backend ensemble:
#   genai-perf profile -m MODEL --endpoint-type kserve --backend tensorrtllm --streaming ...
# or, with --dynamo, as any OpenAI-compatible server (the Dynamo frontend of `kiln serve --dynamo`):
#   genai-perf profile -m MODEL --endpoint-type chat --streaming -u 127.0.0.1:HTTP_PORT ...
#
# Usage:
#   scripts/genai_perf.sh [ENGINE_DIR] [--url HOST:PORT] [--dynamo] [--workers N] [--model NAME]
#                         [--concurrency N] [--requests N] [--isl TOKENS] [--osl TOKENS] [--artifact-dir DIR]
#   ENGINE_DIR       engine folder (default engines/$RECIPE, RECIPE defaults to tiny-fp32); its tokenizer makes
#                    the synthetic prompts and counts tokens
#   --url            profile the server already listening there (e.g. 127.0.0.1:8001, from `kiln serve`, or
#                    127.0.0.1:8000 with --dynamo); without it the script starts `kiln serve ENGINE_DIR [--dynamo]`
#                    on free loopback ports and stops it after
#   --dynamo         the OpenAI chat endpoint of `kiln serve --dynamo` (--workers N workers, default 2)
#
# genai-perf lives in its own venv (.venv-genai-perf, created on first use): genai-perf==0.0.16 plus
# tritonclient==2.51.0, whose wheel carries the perf_analyzer binary genai-perf runs (PyPI's perf-analyzer
# wheels need a newer glibc). That binary wants libb64.so.0d and libcudart.so.12: the nvidia-pytriton wheel
# in the project venv ships both (renamed), so .venv-genai-perf/pa-libs links them under the expected names.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN_VENV="$ROOT/.venv"
GP_VENV="$ROOT/.venv-genai-perf"
PYTHON="${PYTHON:-python3.11}"

die() { echo "genai_perf.sh: $*" >&2; exit 2; }

ENGINE="$ROOT/engines/${RECIPE:-tiny-fp32}"
if [[ $# -ge 1 && "$1" != --* ]]; then ENGINE="$1"; shift; fi
[[ -f "$ENGINE/tokenizer.json" ]] || die "$ENGINE: not an engine folder (no tokenizer.json); build one with 'make engine RECIPE=...' or 'kiln build RECIPE'"
ENGINE="$(cd "$ENGINE" && pwd)"
SERVE=1; URL=""; MODEL="llmkiln"; CONCURRENCY=2; REQUESTS=20; ISL=64; OSL=32; DYNAMO=0; WORKERS=2
ARTIFACTS="$ROOT/bench/results/raw/genai-perf"  # git-ignored
while [[ $# -gt 0 ]]; do
  case "$1" in
    --url) URL="$2"; SERVE=0; shift 2 ;;
    --dynamo) DYNAMO=1; shift ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --concurrency) CONCURRENCY="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --isl) ISL="$2"; shift 2 ;;
    --osl) OSL="$2"; shift 2 ;;
    --artifact-dir) ARTIFACTS="$2"; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done

setup_venv() {
  [[ -x "$MAIN_VENV/bin/python" ]] || die "$MAIN_VENV is missing: install the project first (make venv)"
  if [[ ! -f "$GP_VENV/.complete" ]]; then  # the stamp is written last: a half-made venv is rebuilt
    echo "genai_perf.sh: creating $GP_VENV (genai-perf 0.0.16, perf_analyzer from tritonclient 2.51.0)" >&2
    rm -rf "$GP_VENV"
    "$PYTHON" -m venv "$GP_VENV"
    "$GP_VENV/bin/pip" install -q "genai-perf==0.0.16" "tritonclient==2.51.0"
    touch "$GP_VENV/.complete"
  fi
  local libs
  libs="$("$MAIN_VENV/bin/python" -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs")')"
  mkdir -p "$GP_VENV/pa-libs"
  ln -sf "$(ls "$libs"/libb64-*.so.0d | head -1)" "$GP_VENV/pa-libs/libb64.so.0d"
  ln -sf "$(ls "$libs"/libcudart-*.so.12* | head -1)" "$GP_VENV/pa-libs/libcudart.so.12"
  LD_LIBRARY_PATH="$GP_VENV/pa-libs" "$GP_VENV/bin/perf_analyzer" --version >/dev/null \
    || die "perf_analyzer from tritonclient 2.51.0 does not start (missing shared libraries?)"
}

free_port() { "$MAIN_VENV/bin/python" -c 'from llmkiln.serve.server import free_ports; print(free_ports(1)[0])'; }

SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true
  fi
}
trap cleanup EXIT

setup_venv

if [[ $SERVE -eq 1 && $DYNAMO -eq 1 ]]; then
  HTTP=$(free_port)
  URL="127.0.0.1:$HTTP"
  LOG="$(mktemp -t kiln-serve-XXXX.log)"
  "$MAIN_VENV/bin/kiln" serve "$ENGINE" --dynamo --workers "$WORKERS" --http-port "$HTTP" 2>"$LOG" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    grep -q "^ready in" "$LOG" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$LOG" >&2; die "kiln serve --dynamo exited"; }
    sleep 0.5
  done
  grep -q "^ready in" "$LOG" || die "kiln serve --dynamo not ready after 300 s (log: $LOG)"
  MODEL="$("$MAIN_VENV/bin/python" -c 'import sys; from llmkiln.engine_dir import EngineDir; from pathlib import Path; print(EngineDir(Path(sys.argv[1])).recipe().serve.model_name)' "$ENGINE")"
elif [[ $SERVE -eq 1 ]]; then
  HTTP=$(free_port); GRPC=$(free_port); METRICS=$(free_port)
  while [[ "$GRPC" == "$HTTP" ]]; do GRPC=$(free_port); done
  while [[ "$METRICS" == "$HTTP" || "$METRICS" == "$GRPC" ]]; do METRICS=$(free_port); done
  URL="127.0.0.1:$GRPC"
  LOG="$(mktemp -t kiln-serve-XXXX.log)"
  "$MAIN_VENV/bin/kiln" serve "$ENGINE" --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" 2>"$LOG" &
  SERVER_PID=$!
  for _ in $(seq 600); do
    grep -q "^ready: model" "$LOG" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$LOG" >&2; die "kiln serve exited"; }
    sleep 0.5
  done
  grep -q "^ready: model" "$LOG" || die "kiln serve not ready after 300 s (log: $LOG)"
  MODEL="$(sed -n "s/^ready: model '\(.*\)'/\1/p" "$LOG" | head -1)"
fi

mkdir -p "$ARTIFACTS"
cd "$ARTIFACTS"  # genai-perf writes a few files into the working directory too
if [[ $DYNAMO -eq 1 ]]; then
  ENDPOINT=(--endpoint-type chat)  # OpenAI chat completions, as genai-perf profiles any OpenAI server
else
  ENDPOINT=(--endpoint-type kserve --backend tensorrtllm)
fi
PATH="$GP_VENV/bin:$PATH" LD_LIBRARY_PATH="$GP_VENV/pa-libs" "$GP_VENV/bin/genai-perf" profile \
  -m "$MODEL" "${ENDPOINT[@]}" --streaming \
  -u "$URL" --tokenizer "$ENGINE" \
  --concurrency "$CONCURRENCY" --request-count "$REQUESTS" --warmup-request-count 2 \
  --synthetic-input-tokens-mean "$ISL" --synthetic-input-tokens-stddev 0 --output-tokens-mean "$OSL" \
  --artifact-dir "$ARTIFACTS"
echo "genai_perf.sh: results in $ARTIFACTS" >&2
