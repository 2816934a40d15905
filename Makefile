# Two commands do all set-up on a fresh machine:
#   make demo   trains and evaluates a VFL model on an embedded dataset and prints a table
#   make test   runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel of torch is pinned so that pip never pulls the multi-GB CUDA build.
TORCH ?= torch==2.13.0
# Where pip finds that CPU wheel. Empty: the default index (it serves the CPU build on this kind of
# machine). On a machine where PyPI would give the CUDA build (Linux x86_64), use PyTorch's CPU index:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_INDEX_ARGS := $(if $(strip $(TORCH_INDEX)),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple,)

.PHONY: demo test test-fast lint typecheck docs venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (once; later runs skip this)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "==> [1/3] upgrading pip"
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "==> [2/3] installing $(TORCH), the CPU build: a large download that takes a few minutes and prints" \
		"nothing until it is done"
	$(BIN)/python -m pip install --quiet $(TORCH_INDEX_ARGS) "$(TORCH)"
	@echo "==> [3/3] installing vflbench and its other dependencies (editable, extras dev, cluster, he, net, docs)"
	$(BIN)/python -m pip install --quiet -e ".[dev,cluster,he,net,docs]"
	@touch $(STAMP)
	@echo "==> $(VENV) is ready"

demo: $(STAMP)
	@echo "==> training the demo: a 2-party VHNN on the embedded digits data, vs the active party alone"
	$(BIN)/vflbench run configs/demo.yaml --out runs/demo

# Tests run in parallel (pytest-xdist), one worker per core, a test file per worker at a time (so that a file's
# shared trained fixtures are built once); PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= auto
PYTEST_ARGS := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The core tests (everything not marked slow), for a developer's edit loop: under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy src

# The documentation site (MkDocs + Material + mkdocstrings): every warning is an error; site/ is the output.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) runs site .pytest_cache
