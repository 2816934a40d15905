# Two commands do all set-up on a fresh machine:
#   make demo   trains and evaluates a VFL model on an embedded dataset and prints a table
#   make test   runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel of torch is pinned so that pip never pulls the multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vflbench run configs/demo.yaml --out runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
