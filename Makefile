# Both entry points create .venv themselves, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 is the CPU wheel kept on local disk on these machines; an unpinned torch pulls a CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test venv bench clean

$(BIN)/meshplan: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/meshplan

venv: $(BIN)/meshplan

$(BIN)/.torch: $(BIN)/meshplan
	$(BIN)/pip install -q "$(TORCH)"
	touch $(BIN)/.torch

# Optional test helpers: the frameworks' own config parsers and a headless browser for the report. Tests that need
# them skip with a message when they could not be installed. DeepSpeed is an sdist whose setup.py imports torch, so
# it builds without isolation against the torch above (no DS_BUILD_* variables: its ops stay JIT-built, never
# compiled here). torchtitan 0.3 cannot share one environment with the 0.2 of the parsers extra: it goes, without
# its training dependencies, into $(VENV)/torchtitan3 with the two its config parser imports (spmd_types; torchao
# for the float8 converters), and the tests run it in a subprocess.
DEEPSPEED ?= deepspeed==0.19.8
TORCHTITAN3 ?= torchtitan==0.3.0 spmd_types==0.2.3 torchao==0.18.0
$(BIN)/.extras: $(BIN)/.torch
	$(BIN)/pip install -q "$(TORCH)" -e ".[parsers]" 2>/dev/null || echo "framework parsers not installed; their tests skip"
	$(BIN)/pip install -q --no-build-isolation "$(TORCH)" "$(DEEPSPEED)" 2>/dev/null \
		|| echo "deepspeed not installed; its parser tests skip"
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/torchtitan3 $(TORCHTITAN3) 2>/dev/null \
		|| echo "torchtitan 0.3 not installed; its parser tests skip"
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed; the browser test skips"; fi
	touch $(BIN)/.extras

demo: venv
	$(BIN)/meshplan demo

test: venv $(BIN)/.torch $(BIN)/.extras
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
