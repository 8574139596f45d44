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

# Optional test helpers: the frameworks' config parsers and a headless browser for the report. Tests that need
# them skip with a message when they could not be installed.
$(BIN)/.extras: $(BIN)/.torch
	$(BIN)/pip install -q "$(TORCH)" -e ".[parsers]" 2>/dev/null || echo "framework parsers not installed; their tests skip"
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
