#!/usr/bin/env bash
# The CPU kernel study (docs/cpu-engine.md) in one command, from the repository root:
#   bash scripts/cpu_kernel_study.sh [--quick] [OUT]        (default OUT: bench/results/cpu-kernels)
# Makes what it needs under $WORK (default /tmp/llmkiln-kernels): the generated bench-llama-125m, its engines under
# $ENGINES (default $WORK/engines: kiln build bench-optimized, bench-ov-fp32, and bench-ov-bf16 where the CPU has
# bf16), int8 accuracy_level-4 exports, an OpenVINO venv (openvino, openvino-genai, optimum-intel from PyPI) and its
# IR export; then times every path in its own process, runs the in-process runner loops (onnxruntime, torch,
# OpenVINO) and writes OUT/*.json and OUT/SUMMARY.md. SKIP_OV=1 leaves out the OpenVINO venv's studies (the
# openvino-cpu engines' runner loops still run: openvino is a package dependency). Run it on an otherwise idle
# machine (it records the load). PY (default .venv/bin/python) runs every step, kiln as `$PY -m llmkiln.cli.main`.
#
# --quick (or QUICK=1): every step on stories260K (engines stories-fp32, stories-ov-fp32), tiny shapes, one round,
# no OpenVINO venv (SKIP_OV=1). It measures nothing and takes seconds: it checks that the study still runs
# (tests/experiments/test_cpu_kernel_study.py runs it).
set -euo pipefail
QUICK=${QUICK:-}
if [ "${1:-}" = --quick ]; then
  QUICK=1
  shift
fi
OUT=${1:-bench/results/cpu-kernels}
WORK=${WORK:-/tmp/llmkiln-kernels}
PY=${PY:-.venv/bin/python}
STORIES=${STORIES:-../shared/models/stories260K}
ENGINES=${ENGINES:-$WORK/engines}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
kiln() { "$PY" -m llmkiln.cli.main "$@"; }
mkdir -p "$OUT" "$WORK"

if [ -n "$QUICK" ]; then
  SKIP_OV=1
  MODEL=$STORIES ORT=stories-fp32 OVP=stories-ov
  INT8=$WORK/exports/stories-int8-acc4 STORIES_INT8=$WORK/exports/stories-int8-acc4
  MODE=(--quick)
else
  MODEL=$WORK/bench-llama-125m ORT=bench-optimized OVP=bench-ov
  INT8=$WORK/exports/bench-int8-acc4 STORIES_INT8=$WORK/exports/stories-int8-acc4
  MODE=()
  [ -f "$MODEL/model.safetensors" ] || kiln model init bench-llama-125m "$MODEL"
fi
# bf16 paths only where the CPU has bf16 arithmetic (AVX512-BF16 or AMX, as OpenVINO reports it): kiln build
# refuses an OpenVINO bf16 engine elsewhere, and oneDNN's bf16 products need AVX-512 (an AVX2-only CPU has none)
BF16=$("$PY" -c 'from llmkiln.runtime.openvino_runner import cpu_capabilities; print("BF16" in cpu_capabilities()[1])')
DTYPES=(fp32) OV_RUNNERS=(ov-fp32)
if [ "$BF16" = True ]; then DTYPES+=(bf16) OV_RUNNERS+=(ov-bf16); fi
OV_BEST=${OV_RUNNERS[-1]}  # the prefill-batching trade-off runs on the lowest precision there is
kiln build "$ORT" --engines-dir "$ENGINES" --quiet
for r in "${OV_RUNNERS[@]}"; do kiln build "$OVP-${r#ov-}" --engines-dir "$ENGINES" --quiet; done

ARGS=(--model "$MODEL" --engine "$ENGINES/$ORT" --stories "$STORIES" --int8-engine "$INT8"
      --stories-int8 "$STORIES_INT8" --dtypes "$(IFS=,; echo "${DTYPES[*]}")" --out "$OUT" "${MODE[@]}")
PREP=exports
if [ -z "${SKIP_OV:-}" ]; then PREP=exports,ov-inputs; fi
"$PY" -m experiments.cpu_kernel_study --paths "$PREP" "${ARGS[@]}"
if [ -z "${SKIP_OV:-}" ]; then
  OV=$WORK/venv-ov
  if [ ! -x "$OV/bin/optimum-cli" ]; then
    /usr/bin/python3.11 -m venv "$OV"
    "$OV/bin/pip" install -q "openvino==2026.4.*" "openvino-genai==2026.4.*" "openvino-tokenizers==2026.4.*" \
      "optimum-intel[openvino]" numpy
  fi
  [ -f "$WORK/ov-bench-fp32/openvino_model.xml" ] || "$OV/bin/optimum-cli" export openvino \
    --model "$MODEL" --weight-format fp32 --task text-generation-with-past "$WORK/ov-bench-fp32"
  "$OV/bin/python" experiments/cpu_study_openvino.py "$WORK/exports/stories-fp32/model.onnx" \
    --logits "$OUT/stories-eval-ids.json" --out "$WORK/openvino-stories-logits.npz"
  "$OV/bin/python" experiments/cpu_study_openvino.py "$ENGINES/$ORT/model.onnx" --out "$OUT/openvino.json"
  [ -f "$WORK/ov-stories-fp32/openvino_model.xml" ] || "$OV/bin/optimum-cli" export openvino \
    --model "$STORIES" --weight-format fp32 --task text-generation-with-past "$WORK/ov-stories-fp32"
  "$OV/bin/python" experiments/cpu_study_openvino_paged.py "$WORK/ov-stories-fp32" \
    --logits "$OUT/stories-eval-ids.json" --out "$WORK/openvino-paged-stories-logits.npz"
  "$OV/bin/python" experiments/cpu_study_openvino_paged.py "$WORK/ov-bench-fp32" --out "$OUT/openvino-paged.json"
  "$OV/bin/python" experiments/cpu_study_openvino_genai.py "$WORK/ov-bench-fp32" --out "$OUT/openvino-genai.json"
  ARGS+=(--ov-logits "$WORK/openvino-stories-logits.npz" --ov-paged-logits "$WORK/openvino-paged-stories-logits.npz")
fi
"$PY" -m experiments.cpu_kernel_study --paths gemm,ort,ort-int8,torch,hf,quality "${ARGS[@]}"
"$PY" -m experiments.cpu_kernel_study --summarize --out "$OUT"

# In-process runner loops: the same scheduler and requests on each runner (the openvino-cpu engines in this venv).
loop() { OMP_WAIT_POLICY=PASSIVE "$PY" -m experiments.cpu_runner_loop "${MODE[@]}" "$@"; }
for r in ort "${DTYPES[@]/#/torch-}"; do
  loop --runner "$r" --engine "$ENGINES/$ORT" --model "$MODEL" --out "$OUT/loop-$r.json"
done
for r in "${OV_RUNNERS[@]}"; do
  loop --runner "$r" --ov-engine "$ENGINES/$OVP-${r#ov-}" --out "$OUT/loop-$r.json"
done
# the prefill-batching trade-off (TTFT p50 vs p95 and tok/s): past prefills alone, 2, 5 (default) or 10 per run
for v in "alone --no-batch-past" "mpt256 --max-prefill-tokens 256" "mpt1024 --max-prefill-tokens 1024"; do
  set -- $v
  loop --runner "$OV_BEST" "${@:2}" --ov-engine "$ENGINES/$OVP-${OV_BEST#ov-}" --out "$OUT/loop-$OV_BEST-$1.json"
done
loop --runner "$OV_BEST" --concurrency 1 --requests 8 --ov-engine "$ENGINES/$OVP-${OV_BEST#ov-}" \
  --out "$OUT/loop-$OV_BEST-c1.json"
loop --runner ort --concurrency 1 --requests 8 --engine "$ENGINES/$ORT" --out "$OUT/loop-ort-c1.json"
"$PY" -m experiments.cpu_kernel_study --summarize --out "$OUT"
