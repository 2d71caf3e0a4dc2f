#!/usr/bin/env bash
# The CPU kernel study (docs/cpu-engine.md) in one command, from the repository root:
#   bash scripts/cpu_kernel_study.sh [OUT]        (default OUT: bench/results/cpu-kernels)
# Makes what it needs under $WORK (default /tmp/llmkiln-kernels): the generated bench-llama-125m, its fp32 engine
# (kiln build bench-optimized), int8 accuracy_level-4 exports, an OpenVINO venv (openvino, openvino-genai,
# optimum-intel from PyPI) and its IR export; then times every path in its own process and writes OUT/*.json and
# OUT/SUMMARY.md. SKIP_OV=1 leaves OpenVINO out. Run it on an otherwise idle machine (it records the load).
set -euo pipefail
OUT=${1:-bench/results/cpu-kernels}
WORK=${WORK:-/tmp/llmkiln-kernels}
PY=${PY:-.venv/bin/python}
STORIES=${STORIES:-../shared/models/stories260K}
export PYTHONPATH=$PWD
mkdir -p "$OUT" "$WORK"
[ -f "$WORK/bench-llama-125m/model.safetensors" ] || .venv/bin/kiln model init bench-llama-125m "$WORK/bench-llama-125m"
.venv/bin/kiln build bench-optimized --engines-dir "$WORK/engines" --quiet
ARGS=(--model "$WORK/bench-llama-125m" --engine "$WORK/engines/bench-optimized" --stories "$STORIES"
      --int8-engine "$WORK/exports/bench-int8-acc4" --stories-int8 "$WORK/exports/stories-int8-acc4" --out "$OUT")
$PY -m experiments.cpu_kernel_study --paths exports,eval-ids "${ARGS[@]}"
if [ -z "${SKIP_OV:-}" ]; then
  OV=$WORK/venv-ov
  if [ ! -x "$OV/bin/optimum-cli" ]; then
    /usr/bin/python3.11 -m venv "$OV"
    "$OV/bin/pip" install -q "openvino==2026.4.*" "openvino-genai==2026.4.*" "openvino-tokenizers==2026.4.*" \
      "optimum-intel[openvino]" numpy
  fi
  [ -f "$WORK/ov-bench-fp32/openvino_model.xml" ] || "$OV/bin/optimum-cli" export openvino \
    --model "$WORK/bench-llama-125m" --weight-format fp32 --task text-generation-with-past "$WORK/ov-bench-fp32"
  "$OV/bin/python" experiments/cpu_study_openvino.py "$WORK/exports/stories-fp32/model.onnx" \
    --logits "$OUT/stories-eval-ids.json" --out "$WORK/openvino-stories-logits.npz"
  "$OV/bin/python" experiments/cpu_study_openvino.py "$WORK/engines/bench-optimized/model.onnx" --out "$OUT/openvino.json"
  [ -f "$WORK/ov-stories-fp32/openvino_model.xml" ] || "$OV/bin/optimum-cli" export openvino \
    --model "$STORIES" --weight-format fp32 --task text-generation-with-past "$WORK/ov-stories-fp32"
  "$OV/bin/python" experiments/cpu_study_openvino_paged.py "$WORK/ov-stories-fp32" \
    --logits "$OUT/stories-eval-ids.json" --out "$WORK/openvino-paged-stories-logits.npz"
  "$OV/bin/python" experiments/cpu_study_openvino_paged.py "$WORK/ov-bench-fp32" --out "$OUT/openvino-paged.json"
  "$OV/bin/python" experiments/cpu_study_openvino_genai.py "$WORK/ov-bench-fp32" --out "$OUT/openvino-genai.json"
  ARGS+=(--ov-logits "$WORK/openvino-stories-logits.npz" --ov-paged-logits "$WORK/openvino-paged-stories-logits.npz")
fi
$PY -m experiments.cpu_kernel_study --paths gemm,ort,ort-int8,torch,hf,quality "${ARGS[@]}"
$PY -m experiments.cpu_kernel_study --summarize --out "$OUT"
for r in ort torch-fp32 torch-bf16; do
  OMP_WAIT_POLICY=PASSIVE $PY -m experiments.cpu_runner_loop --runner "$r" --engine "$WORK/engines/bench-optimized" \
    --model "$WORK/bench-llama-125m" --out "$OUT/loop-$r.json"
done
if [ -z "${SKIP_OV:-}" ]; then
  "$OV/bin/pip" install -q pydantic pyyaml ml_dtypes pytest  # the runtime's own imports, for the OpenVINO runner
  for r in ov-fp32 ov-bf16; do
    "$OV/bin/python" -m experiments.cpu_runner_loop --runner "$r" --engine "$WORK/engines/bench-optimized" \
      --ov-model "$WORK/ov-bench-fp32" --out "$OUT/loop-$r.json"
  done
  # the prefill-batching trade-off (TTFT p50 vs p95 and tok/s): past prefills alone, 2, 5 (default) or 10 per run
  for v in "alone --no-batch-past" "mpt256 --max-prefill-tokens 256" "mpt1024 --max-prefill-tokens 1024"; do
    set -- $v
    "$OV/bin/python" -m experiments.cpu_runner_loop --runner ov-bf16 "${@:2}" --engine "$WORK/engines/bench-optimized" \
      --ov-model "$WORK/ov-bench-fp32" --out "$OUT/loop-ov-bf16-$1.json"
  done
  "$OV/bin/python" -m experiments.cpu_runner_loop --runner ov-bf16 --concurrency 1 --requests 8 \
    --engine "$WORK/engines/bench-optimized" --ov-model "$WORK/ov-bench-fp32" --out "$OUT/loop-ov-bf16-c1.json"
  $PY -m experiments.cpu_runner_loop --runner ort --concurrency 1 --requests 8 \
    --engine "$WORK/engines/bench-optimized" --out "$OUT/loop-ort-c1.json"
fi
$PY -m experiments.cpu_kernel_study --summarize --out "$OUT"
