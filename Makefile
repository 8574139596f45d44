# Both entry points create .venv themselves, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 is the CPU wheel kept on local disk on these machines; an unpinned torch pulls a CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test venv bench clean serve-parsers-old

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
# Serving-engine parsers (tests/unit/test_serve_export.py): each release in its own folder under $(SERVEP) with only the
# modules its CLI parser imports (--no-deps), run in a subprocess. vLLM comes from its sdist (1.2 / 10.8 MB; the
# wheels are 170 / 440 MB of CUDA kernels a parser never loads), fetched from the registry by URL and only its
# vllm/ package unpacked (no build: a parser needs the Python files). SGLang comes from its wheels (0.3 / 39 MB).
SERVEP := $(VENV)/serveparsers
VLLM060_SDIST ?= https://files.pythonhosted.org/packages/09/14/4dd0f508e8bb6d37f86feb4f588734bc7c9275c7b077b4ee0ab3e8103b7c/vllm-0.6.0.tar.gz
VLLM011_SDIST ?= https://files.pythonhosted.org/packages/82/5a/36d2351206f4d8d871b10780f874d03957985e08298d430cc837723e07af/vllm-0.11.0.tar.gz
SERVE_AIOHTTP := aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
	aiosignal==1.4.0 frozenlist==1.8.0 attrs==26.1.0
VLLM060_DEPS ?= transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.6 safetensors==0.8.0 \
	regex==2026.11.19 msgspec==0.23.0 gguf==0.19.0 sentencepiece==0.2.3 mistral_common==1.3.4 jsonschema==4.26.0 \
	jsonschema_specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 tiktoken==0.14.0 openai==1.43.0 \
	httpx==0.28.1 sniffio==1.3.1 distro==1.9.0 jiter==0.19.0 $(SERVE_AIOHTTP)
VLLM011_DEPS ?= transformers==4.57.1 tokenizers==0.22.1 huggingface_hub==0.35.3 safetensors==0.8.0 \
	regex==2026.11.19 cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 setproctitle==1.3.8 pyzmq==27.3.0 \
	blake3==1.0.11 diskcache==5.6.3 msgspec==0.23.0 pybase64==1.5.1 partial-json-parser==0.2.1.1.post7 \
	openai==3.57.0 openai-harmony==0.0.8 sniffio==1.3.1 fastapi==0.118.0 starlette==0.48.0 python-multipart==0.0.34 \
	prometheus_client==0.26.0 prometheus-fastapi-instrumentator==8.1.0 uvicorn==0.54.0 uvloop==0.23.0 \
	watchfiles==1.3.0 $(SERVE_AIOHTTP)
SGLANG030 ?= sglang==0.3.0 transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.6 safetensors==0.8.0 \
	regex==2026.11.19 $(SERVE_AIOHTTP)
SGLANG0523 ?= sglang==0.5.23 transformers==5.19.0 safetensors==0.8.0 regex==2026.11.19 orjson==3.13.0 \
	pybase64==1.5.1 starlette==1.10.0 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 $(SERVE_AIOHTTP)
# $(call vllm_parser,VERSION,SDIST_URL,DEPS): one vLLM release's parser folder
define vllm_parser
rm -rf $(SERVEP)/vllm-$(1) && mkdir -p $(SERVEP)/sdist && $(BIN)/python -c "import sys, urllib.request; \
	urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" "$(2)" $(SERVEP)/sdist/vllm-$(1).tar.gz && \
	$(BIN)/pip install -q --no-deps --target $(SERVEP)/vllm-$(1) $(3) && tar -xzf $(SERVEP)/sdist/vllm-$(1).tar.gz \
	-C $(SERVEP)/vllm-$(1) --strip-components=1 vllm-$(1)/vllm
endef
$(BIN)/.extras: $(BIN)/.torch
	$(BIN)/pip install -q "$(TORCH)" -e ".[parsers]" 2>/dev/null || echo "framework parsers not installed; their tests skip"
	$(BIN)/pip install -q --no-build-isolation "$(TORCH)" "$(DEEPSPEED)" 2>/dev/null \
		|| echo "deepspeed not installed; its parser tests skip"
	$(BIN)/pip install -q --no-deps --upgrade --target $(VENV)/torchtitan3 $(TORCHTITAN3) 2>/dev/null \
		|| echo "torchtitan 0.3 not installed; its parser tests skip"
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium not installed; the browser test skips"; fi
	# the current releases' parser folders download side by side (each its own --target); the older releases'
	# (vLLM 0.6.0, SGLang 0.3.0: the validation rows' engines) come with `make serve-parsers-old`
	{ ($(call vllm_parser,0.11.0,$(VLLM011_SDIST),$(VLLM011_DEPS))) 2>/dev/null \
		|| echo "vLLM 0.11.0 parser not installed; its parser tests skip"; } & \
	{ $(BIN)/pip install -q --no-deps --upgrade --target $(SERVEP)/sglang-0.5.23 $(SGLANG0523) 2>/dev/null \
		|| echo "SGLang 0.5.23 parser not installed; its parser tests skip"; } & \
	wait
	touch $(BIN)/.extras

# The parsers of the older engine releases the serving profiles also export to (their tests skip without them).
serve-parsers-old: venv
	$(call vllm_parser,0.6.0,$(VLLM060_SDIST),$(VLLM060_DEPS))
	$(BIN)/pip install -q --no-deps --upgrade --target $(SERVEP)/sglang-0.3.0 $(SGLANG030)

demo: venv
	$(BIN)/meshplan demo

test: venv $(BIN)/.torch $(BIN)/.extras
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
