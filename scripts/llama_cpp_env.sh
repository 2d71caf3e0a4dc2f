#!/usr/bin/env bash
# llama.cpp's server (llama-cpp-python) as a CPU peer of llmkiln's engine (experiments/cpu_peer_llama_cpp.py,
# llmkiln/bench/llama_cpp_peer.py) in its own venv:
#   bash scripts/llama_cpp_env.sh [VENV_DIR]      (default $LLMKILN_LLAMACPP_VENV or /tmp/llmkiln-llamacpp/venv)
# Prints the venv's python on stdout (everything else goes to stderr). Idempotent: a stamp in the venv holds the
# sha256 of this script; with the stamp in place nothing is installed again.
#
# The recipe:
# 1. Python: /usr/bin/python3.11 ($LLMKILN_LLAMACPP_PYTHON overrides).
# 2. `pip download --no-binary :all: llama-cpp-python==0.3.36` into VENV/src and unpack it there: PyPI has only the
#    sdist, and the sdist vendors llama.cpp, whose convert_hf_to_gguf.py scripts/llama_cpp_gguf.sh runs
#    (VENV/src/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py).
# 3. `pip install 'llama-cpp-python[server] @ file://<that sdist>'` (the same file PyPI serves, so the same
#    package as `pip install 'llama-cpp-python[server]==0.3.36'`), compiled here by scikit-build-core + CMake with
#      CMAKE_BUILD_PARALLEL_LEVEL=${LLMKILN_LLAMACPP_JOBS:-2}   (this machine is shared: two compile jobs at most)
#      CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release"
#    - GGML_NATIVE=ON: -march=native, so ggml's CPU kernels use what this CPU has (AVX2, FMA, F16C here; no
#      AVX-512, no AMX). The library is then only for this class of CPU: rebuild (delete the venv) on another.
#      (GGML_OPENMP stays at its default ON: ggml's thread pool is OpenMP, libgomp from gcc.)
#    - LLAVA_BUILD=OFF: skips llama-cpp-python's mtmd (multimodal) library, which a text model never loads
#      (llama_cpp imports mtmd_cpp only inside the multimodal chat handlers): ~50 fewer C++ sources to compile
#      (the build compiles 127 objects without it).
#    - Release: llama-cpp-python's own default too, stated so that it does not depend on scikit-build's.
#    $LLMKILN_LLAMACPP_CMAKE_ARGS replaces those CMAKE_ARGS.
# 4. `pip install gguf==0.19.0` (the gguf-py release the sdist vendors) plus what convert_hf_to_gguf.py imports:
#    torch==2.13.0 (the local +cpu wheel in pip's find-links /opt/wheels; the same torch as llmkiln's venv),
#    transformers and sentencepiece (its tokenizer export). llama-cpp-python itself needs none of them.
# Time: the build took 879 s (14.7 min) here, 2 compile jobs on the 2-core AMD EPYC VM while another job kept both
# cores busy (load average 3-5); the whole script 15m45s (the converter's torch/transformers ~1 min). A second run
# with the stamp in place returns at once.
set -euo pipefail
VENV=${1:-${LLMKILN_LLAMACPP_VENV:-/tmp/llmkiln-llamacpp/venv}}
PY=${LLMKILN_LLAMACPP_PYTHON:-/usr/bin/python3.11}
VERSION=0.3.36
LLAMA_SPEC=llama-cpp-python==$VERSION
CONVERT_SPECS=(gguf==0.19.0 torch==2.13.0 "transformers>=4.57,<5" "sentencepiece>=0.1.98,<0.3")
CMAKE_FLAGS=${LLMKILN_LLAMACPP_CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release}
JOBS=${LLMKILN_LLAMACPP_JOBS:-2}
stamp="$VENV/.llmkiln-llama-cpp"
want=$(sha256sum <"${BASH_SOURCE[0]}" | cut -d" " -f1)

if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
[ -x "$PY" ] || { echo "llama_cpp_env.sh: no $PY (set LLMKILN_LLAMACPP_PYTHON to a Python >= 3.10)" >&2; exit 2; }
command -v cmake >/dev/null || { echo "llama_cpp_env.sh: no cmake (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "llama_cpp_env.sh: no C++ compiler (apt-get install g++)" >&2; exit 2; }
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >&2
PIP=("$VENV/bin/pip" install --disable-pip-version-check)

src="$VENV/src"
sdist="$src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$src"
  "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary :all: "$LLAMA_SPEC" -d "$src" >&2
fi
[ -f "$src/llama_cpp_python-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" ] || tar -xzf "$sdist" -C "$src"

if ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "llama_cpp_env.sh: building $LLAMA_SPEC (CMAKE_ARGS=$CMAKE_FLAGS, $JOBS jobs): several minutes" >&2
  t0=$(date +%s)
  CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
    "${PIP[@]}" --quiet --no-cache-dir "llama-cpp-python[server] @ file://$sdist" >&2
  echo "llama_cpp_env.sh: built and installed in $(( $(date +%s) - t0 )) s" >&2
fi
"${PIP[@]}" --quiet "${CONVERT_SPECS[@]}" >&2

# a broken install stops here, not at the first benchmark: the library loads and reports its CPU features
"$VENV/bin/python" - >&2 <<'EOF'
import llama_cpp, gguf, torch, transformers
info = llama_cpp.llama_print_system_info().decode()
from importlib.metadata import version
print(f"llama_cpp_env.sh: llama-cpp-python {llama_cpp.__version__}, gguf {version('gguf')},"
      f" torch {torch.__version__}, transformers {transformers.__version__}")
print(f"llama_cpp_env.sh: {info.strip()}")
EOF
echo "$want" >"$stamp"
echo "$VENV/bin/python"
