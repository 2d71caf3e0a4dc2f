#!/usr/bin/env bash
# A Python 3.12 venv for the tests that run under 3.12 too (`make test-py312`, tests/gpu/test_container_setup.py),
# cached at $LLMKILN_PY312_VENV (default .venv-py312, git-ignored); prints its python on stdout. Idempotent: it
# reinstalls only when pyproject.toml or this script changed (a stamp holds their sha256).
#
# What goes in: llmkiln's [project] dependencies except torch (on 3.12 PyPI has only the multi-GB CUDA build, and
# the tests run here — recipe, GPU wing, plans — do not import it), onnxruntime, pytest and hypothesis at their
# pins, and llmkiln itself (editable, --no-deps).
#
# Where Python 3.12 comes from, first found: $LLMKILN_PYTHON312, python3.12 on PATH, pyenv's 3.12.x, else `uv`
# (installed from PyPI into .venv-py312-tools) downloads a standalone CPython 3.12 (python-build-standalone).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LLMKILN_PY312_VENV:-$ROOT/.venv-py312}
TOOLS=$ROOT/.venv-py312-tools
UV_VERSION=0.13.9

find_python() {
  local c
  for c in "${LLMKILN_PYTHON312:-}" "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  # no 3.12 on this machine: a standalone CPython through uv (CI's fresh machine)
  local boot
  boot=$(command -v python3.11 || command -v python3)
  [ -x "$TOOLS/bin/uv" ] || { "$boot" -m venv "$TOOLS" && "$TOOLS/bin/pip" install --quiet "uv==$UV_VERSION"; } >&2
  if ! UV_PYTHON_INSTALL_DIR="$TOOLS/python" "$TOOLS/bin/uv" python install 3.12 >&2; then
    echo "py312_env.sh: no Python 3.12 on this machine, and uv could not download one (it fetches from" \
      "github.com/astral-sh/python-build-standalone): set LLMKILN_PYTHON312=/path/to/python3.12" >&2
    return 1
  fi
  UV_PYTHON_INSTALL_DIR="$TOOLS/python" "$TOOLS/bin/uv" python find 3.12
}

stamp="$VENV/.llmkiln-py312"
want=$(cat "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d" " -f1)  # the pins and this recipe
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
PY=$(find_python)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" >&2
reqs=$("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = [d for d in project["dependencies"] if not re.match(r"torch\b", d)]
deps += [d for d in project["optional-dependencies"]["dev"] if re.match(r"(pytest|hypothesis)\b", d)]
deps += [d for d in project["optional-dependencies"]["cpu"] if re.match(r"onnxruntime\b", d)]
print("\n".join(deps))
EOF
)
echo "$reqs" >"$VENV/requirements-py312.txt"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$VENV/requirements-py312.txt" >&2
# llmkiln itself, without its dependencies: pip refuses it if requires-python excludes 3.12 (the `kiln` script too)
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -e "$ROOT" >&2
echo "$want" >"$stamp"
echo "$VENV/bin/python"
