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

demo: venv
	$(BIN)/meshplan demo

test: venv $(BIN)/.torch
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
