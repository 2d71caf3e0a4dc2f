#!/usr/bin/env bash
# The CPU peers side by side on the real model (`make bench-smollm2-peers`): llmkiln's SmolLM2-135M-Instruct engines
# through both front doors, vLLM's CPU build, OpenVINO GenAI and llama.cpp's server (the package's own Q4_1 GGUF and
# an f16 GGUF written from the converted checkpoint), all on the same checkpoint, machine and workload (the
# cpu_peers shared-prefix workload: 1500-token system prompt + 80-120-token user turns, 32 output tokens, closed
# loop at c=1, 4, 8 with 24, 32, 64 requests), into one summary:
#   bash scripts/bench_smollm2_peers.sh [OUT]          (default bench/results/smollm2-peers)
# Precision follows the CPU: bf16 systems (llmkiln's openvino-cpu bf16, vLLM bf16, OpenVINO GenAI bf16) run only
# where OpenVINO reports BF16 (AVX512-BF16 or AMX); on another CPU they are left out and the script says so.
# About 25 minutes on 2 idle cores with fp32 only (+ ~12 with bf16), plus the peers' venvs the first time
# (vLLM ~1 min, OpenVINO GenAI ~1 min, llama.cpp ~15 min: it compiles).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${1:-bench/results/smollm2-peers}
PY=${PYTHON:-.venv/bin/python}
ENGINES=${ENGINES:-engines}

bash scripts/vllm_cpu_env.sh >/dev/null
bash scripts/openvino_genai_env.sh >/dev/null
LLAMA_PY=$(bash scripts/llama_cpp_env.sh)

# the imported checkpoint (kiln model import: cached after the first build) and its two GGUFs
HF=$("$PY" -m llmkiln.cli.main model import smollm2-fp32 --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["hf_dir"])')
Q4=$("$PY" -m llmkiln.cli.main model import smollm2-fp32 --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gguf"])')
F16="$(dirname "$LLAMA_PY")/../gguf/SmolLM2-135M-Instruct.f16.gguf"
mkdir -p "$(dirname "$F16")"
[ -s "$F16" ] || bash scripts/llama_cpp_gguf.sh "$HF" "$F16" f16 >&2

if "$PY" -c 'from llmkiln.runtime.openvino_runner import cpu_capabilities; import sys; sys.exit(0 if "BF16" in cpu_capabilities()[1] else 1)'; then
  RECIPES=smollm2-fp32,smollm2-ov-fp32,smollm2-ov-bf16
  PRECISIONS=fp32,bf16
  SYSTEMS='*'
else
  echo "bench_smollm2_peers.sh: this CPU has no bf16 arithmetic ($("$PY" -c 'from llmkiln.runtime.openvino_runner import cpu_capabilities; n, c = cpu_capabilities(); print(n, "/", ", ".join(c))')): fp32 systems only" >&2
  RECIPES=smollm2-fp32,smollm2-ov-fp32
  PRECISIONS=fp32
  SYSTEMS='smollm2-*,vllm-fp32'
fi
"$PY" -m experiments.cpu_peers --out "$OUT" --engines-dir "$ENGINES" --recipes "$RECIPES" --systems "$SYSTEMS"
"$PY" -m experiments.cpu_peer_openvino_genai --out "$OUT" --engines-dir "$ENGINES" --engine smollm2-ov-fp32 \
  --precisions "$PRECISIONS"
"$PY" -m experiments.cpu_peer_llama_cpp --out "$OUT" --model "$HF" --gguf "q4_1=$Q4" --gguf "f16=$F16"
echo "$OUT/SUMMARY.md"
