#!/usr/bin/env bash
# OpenVINO GenAI (the in-process peer of experiments/cpu_peer_openvino_genai.py) in its own venv:
#   bash scripts/openvino_genai_env.sh [VENV_DIR]     (default $LLMKILN_OVGENAI_VENV or /tmp/llmkiln-ovgenai/venv)
# Prints the venv's python on stdout (everything else goes to stderr). Idempotent: a stamp in the venv holds the
# sha256 of this script and of pyproject.toml (the pins read from it); with the stamp in place nothing is
# installed again.
#
# What goes in (from PyPI, /usr/bin/python3.11 unless $LLMKILN_OVGENAI_PYTHON):
# - openvino-genai, openvino and openvino-tokenizers at the project's `openvino==X` pin (pyproject.toml, cpu extra):
#   the three are released together and openvino-genai X.0 requires openvino-tokenizers ~= X.0, which requires
#   openvino ~= X; all three are pinned here and checked after the install.
# - transformers and tokenizers at the project's pins: openvino-tokenizers' convert_tokenizer reads the HF
#   tokenizer through transformers' AutoTokenizer (no torch needed: the engine folder's tokenizer.json is a fast
#   tokenizer), and the experiment builds its prompts with llmkiln.bench.workloads (tokenizers only) from the
#   checkout on PYTHONPATH — the same tokenizers release, so the same prompts and ids as the main venv.
# - numpy comes with openvino (the venv never imports llmkiln's pydantic/rich modules: the experiment writes plain
#   JSON records, turned into a BenchReport in the main venv).
# - NVIDIA Dynamo's runtime at the project's pins (ai-dynamo-runtime, and ai-dynamo itself with --no-deps, as `make
#   setup` installs it; pydantic, PyYAML, packaging, msgspec at their pins): experiments/ovgenai_dynamo_worker.py
#   serves the pipeline as a Dynamo worker behind `kiln serve --dynamo`'s front door (cpu_peers' RECIPE/ovgenai-dynamo).
# Not installed: torch, optimum-intel (the IR is llmkiln's own export), onnxruntime (never in this venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${LLMKILN_OVGENAI_VENV:-/tmp/llmkiln-ovgenai/venv}}
PY=${LLMKILN_OVGENAI_PYTHON:-/usr/bin/python3.11}
stamp="$VENV/.llmkiln-ovgenai"
want=$(cat "${BASH_SOURCE[0]}" "$ROOT/pyproject.toml" | sha256sum | cut -d" " -f1)

if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
[ -x "$PY" ] || { echo "openvino_genai_env.sh: no $PY (set LLMKILN_OVGENAI_PYTHON to a Python 3.10-3.13)" >&2; exit 2; }
pin() {  # the version pinned in pyproject.toml for package $1
  "$PY" - "$ROOT/pyproject.toml" "$1" <<'EOF'
import re, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = p["dependencies"] + [d for ds in p["optional-dependencies"].values() for d in ds]
for d in deps:
    m = re.fullmatch(r"\s*" + re.escape(sys.argv[2]) + r"\s*==\s*([^;\s]+)\s*(;.*)?", d)
    if m:
        print(m.group(1))
        break
else:
    sys.exit(f"openvino_genai_env.sh: no {sys.argv[2]}==X pin in {sys.argv[1]}")
EOF
}
OV=$(pin openvino)
TRANSFORMERS=$(pin transformers)
TOKENIZERS=$(pin tokenizers)
DYNAMO=$(pin ai-dynamo-runtime)
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check \
  "openvino==$OV" "openvino-tokenizers==$OV.0" "openvino-genai==$OV.0" \
  "transformers==$TRANSFORMERS" "tokenizers==$TOKENIZERS" \
  "ai-dynamo-runtime==$DYNAMO" "pydantic==$(pin pydantic)" "PyYAML==$(pin PyYAML)" "packaging==$(pin packaging)" \
  "msgspec==$(pin msgspec)" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "ai-dynamo==$DYNAMO" >&2
"$VENV/bin/python" - "$OV" >&2 <<'EOF'
import sys
from importlib import metadata

want = sys.argv[1]
bad = []
for name in ("openvino", "openvino-tokenizers", "openvino-genai"):
    v = metadata.version(name)
    if not (v == want or v.startswith(want + ".")):
        bad.append(f"{name} {v}")
for name in ("torch", "onnxruntime", "onnxruntime-genai"):
    try:
        bad.append(f"{name} {metadata.version(name)} (must not be installed here)")
    except metadata.PackageNotFoundError:
        pass
if bad:
    sys.exit(f"openvino_genai_env.sh: expected openvino* {want}: got " + ", ".join(bad))
import openvino_genai, openvino_tokenizers  # noqa: E401,F401  the libraries load
import dynamo.common.backend.run  # noqa: F401  the Dynamo worker's runtime loads
print(f"openvino-genai {openvino_genai.__version__} ready", file=sys.stderr)
EOF
echo "$want" >"$stamp"
echo "$VENV/bin/python"
