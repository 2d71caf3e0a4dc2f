#!/bin/bash
# The AVX-512 shared pass's kernel alone, one thread, no OpenVINO (README.md): a checkout's tile_block over
# TILES tiles of 16 queries x BLOCKS blocks of 32 keys (D 64, bf16 cache), best of 200.
#   bash bench/results/cpu-speed-zen5/op-softmax/tile_bench.sh CHECKOUT [TILES] [BLOCKS]
set -euo pipefail
SRC=$1/llmkiln/runtime/cascade/cascade_attention.cpp
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
open=$(grep -n "^namespace {" "$SRC" | head -1 | cut -d: -f1)
end=$(grep -n "#endif  // LLMKILN_SIMD" "$SRC" | cut -d: -f1)
{
  sed -n "1,$((open - 1))p" "$SRC" | grep -v "openvino/"
  sed -n "${open},${end}p" "$SRC"
  echo "}"
} > "$TMP/kern.h"
g++ -O3 -march=native -std=c++17 -I"$TMP" "$HERE/tile_bench.cpp" -o "$TMP/tile_bench"
"$TMP/tile_bench" "${2:-8}" "${3:-47}"
