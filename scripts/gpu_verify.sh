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
# 3 and a plan), make engine RECIPE=tiny-trtllm-llmapi and RECIPE=tiny-trtllm-llmapi-ngram (exit 0). Then this
# script, for each path:
#   1. checks tensorrt_llm / tensorrt versions and the GPU's compute capability against the pins (exit 3 if not);
#   2. engine path: kiln build --resume (trtllm-build of the smoke engine, the container's model files compared
#      and taken); LLM-API path: compares and takes the llmapi model files (kiln repo --check --take-model-files);
#   3. starts tritonserver on 127.0.0.1, waits for READY (the recipe's warmup prefixes run before it);
#   4. probes: the first request with the warmup prefix must reuse KV blocks (warmup ran before READY), a fresh
#      long shared prefix sent twice must reuse KV blocks on the second request (kv_cache_reused_block(s));
#      cold vs warm time to first token and the machine go to bench/results/gpu/.
# Nothing is installed into the container's Python. kiln runs from a venv on the mounted checkout that sees the
# container venv's packages: `python3` there is /opt/venv-tritonserver/bin/python3 (the Dockerfile's venv, where
# tensorrt_llm, tensorrt and torch live), and a venv made from a venv with --system-site-packages would see the
# *base* interpreter's site-packages instead. So the setup step makes a plain venv from the container's Python,
# puts a .pth file into it that adds the container venv's site-packages with site.addsitedir (so the .pth files
# in there are processed too: a bare path line would add the folder but skip them), installs llmkiln with
# --no-deps and then only the dependencies that no installed distribution provides (scripts/gpu_missing_deps.py),
# with every distribution the container has as a pip constraint at its installed version (a missing package's
# own dependencies — tritonclient's protobuf, grpcio, urllib3 — can neither replace nor shadow the container's),
# and checks afterwards that the container's torch / tensorrt_llm / tensorrt and every other distribution it had
# are unchanged.
#
# Usage: scripts/gpu_verify.sh [setup] [engine] [llmapi] [speculative]   (default: engine llmapi speculative)
#   setup        only the venv (tests/gpu/test_container_setup.py runs it against a stand-in container on CPU)
#   speculative  LLM-API recipe with and without its speculative: section: acceptance rate, output tokens/s
#                (fails unless the speculative run drafted tokens)
# Paths (env): LLMKILN_CONTAINER_VENV (/opt/venv-tritonserver), LLMKILN_CONTAINER_PYTHON ($it/bin/python3),
# LLMKILN_GPU_VENV ($ROOT/.venv-gpu), LLMKILN_TRTLLM_MODELS / LLMKILN_TRTLLM_LLMAPI_MODELS (the container's model
# files, /app/all_models/inflight_batcher_llm and /app/all_models/llmapi),
# LLMKILN_ENGINES, LLMKILN_GPU_RESULTS, LLMKILN_HTTP_PORT, LLMKILN_PROBE_ROUNDS.
# Exit codes: 0 every check passed, 1 a check failed, 2 bad input (missing engine/plan), 3 versions or GPU do not
# match the pins (smoke versions).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENGINES=${LLMKILN_ENGINES:-$ROOT/engines}
RESULTS=${LLMKILN_GPU_RESULTS:-$ROOT/bench/results/gpu}
VENV=${LLMKILN_GPU_VENV:-$ROOT/.venv-gpu}
PATHS=${*:-engine llmapi speculative}
HTTP_PORT=${LLMKILN_HTTP_PORT:-18000}
ROUNDS=${LLMKILN_PROBE_ROUNDS:-5}

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit "${2:-1}"; }

CONTAINER_VENV=${LLMKILN_CONTAINER_VENV:-/opt/venv-tritonserver}
CONTAINER_PY=${LLMKILN_CONTAINER_PYTHON:-$CONTAINER_VENV/bin/python3}
KILN="$VENV/bin/kiln"
PY="$VENV/bin/python"

setup_venv() {
  say "kiln in $VENV (sees $CONTAINER_VENV: the container's tensorrt_llm, tensorrt, torch)"
  [ -x "$CONTAINER_PY" ] || fail "no container Python at $CONTAINER_PY (set LLMKILN_CONTAINER_VENV)" 2
  if [ ! -x "$VENV/bin/python" ]; then
    # without ensurepip in the base Python (no python3-venv package), a venv without pip, driven by the container's pip
    "$CONTAINER_PY" -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV" && "$CONTAINER_PY" -m venv --without-pip "$VENV"; }
  fi
  local pip=("$VENV/bin/pip")
  [ -x "$VENV/bin/pip" ] || pip=("$CONTAINER_PY" -m pip --python "$VENV/bin/python")
  local pth site
  pth=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_llmkiln_container.pth
  # purelib and platlib of the container venv (the same folder on Debian/Ubuntu builds, kept apart if not)
  site=$("$CONTAINER_PY" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' | sort -u)
  # one line: `import site; site.addsitedir(...)` for each folder (Python runs .pth lines that start with import)
  printf '%s\n' "$site" | "$CONTAINER_PY" -c 'import sys; print("import site; " + "; ".join(f"site.addsitedir({p.strip()!r})" for p in sys.stdin if p.strip()))' >"$pth"
  local before after constraints missing kept_before kept_after
  constraints="$VENV/container-constraints.txt"
  "$PY" "$ROOT/scripts/gpu_missing_deps.py" "$ROOT/pyproject.toml" --installed >"$constraints"
  kept_before=$(cat "$constraints")
  before=$("$PY" "$ROOT/scripts/gpu_missing_deps.py" "$ROOT/pyproject.toml" --protected)
  [ -x "$KILN" ] || "${pip[@]}" install --quiet --no-deps -e "$ROOT"
  missing=$("$PY" "$ROOT/scripts/gpu_missing_deps.py" "$ROOT/pyproject.toml")
  if [ -n "$missing" ]; then
    say "installing what the container lacks: ${missing//$'\n'/ }"
    # shellcheck disable=SC2086  # one requirement per word
    "${pip[@]}" install --quiet --constraint "$constraints" $missing
  fi
  after=$("$PY" "$ROOT/scripts/gpu_missing_deps.py" "$ROOT/pyproject.toml" --protected)
  [ "$before" = "$after" ] || fail "the setup changed the container's packages: before [$before], after [$after]"
  kept_after=$("$PY" "$ROOT/scripts/gpu_missing_deps.py" "$ROOT/pyproject.toml" --installed)
  local changed
  changed=$(comm -23 <(printf '%s\n' "$kept_before" | sort) <(printf '%s\n' "$kept_after" | sort))
  [ -z "$changed" ] || fail "the setup replaced or shadowed the container's packages: ${changed//$'\n'/ }"
  echo "container packages kept: ${after//$'\n'/ } (and $(printf '%s\n' "$kept_before" | grep -c .) others)"
}

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

setup_venv
for path in $PATHS; do
  case "$path" in
    setup) ;;
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
      say "$recipe: llm_api_options.yaml through the installed TorchLlmArgs (nested keys, enums)"
      "$PY" -m llmkiln.trtllm.smoke options "$ENGINES/$recipe/llm_api_options.yaml" \
        --model "$ENGINES/$recipe/hf_checkpoint"
      say "$recipe: serve and probe"
      serve_and_probe "$ENGINES/$recipe/triton_repo" llmapi "$recipe"
      ;;
    speculative)
      recipe=tiny-trtllm-llmapi-ngram
      say "$recipe: versions and compute capability against the pins"
      "$PY" -m llmkiln.trtllm.smoke versions "$recipe"
      [ -f "$ENGINES/$recipe/manifest.json" ] || fail "no $ENGINES/$recipe: run 'make engine RECIPE=$recipe' first" 2
      "$PY" -m llmkiln.trtllm.smoke options "$ENGINES/$recipe/llm_api_options.yaml" \
        --model "$ENGINES/$recipe/hf_checkpoint"
      say "$recipe: acceptance rate and output tokens/s, with and without speculative decoding"
      "$PY" -m llmkiln.trtllm.smoke speculative "$ENGINES/$recipe" --out "$RESULTS"
      ;;
    *) fail "unknown path '$path' (setup, engine, llmapi, speculative)" 2 ;;
  esac
done
if [ "$PATHS" = setup ]; then say "setup done: $KILN"; else say "all GPU checks passed; results in $RESULTS"; fi
