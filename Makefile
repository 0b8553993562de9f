# perfkit: `make suite` runs the investigation suite on the reference engine, `make test` the tests.
# Each `make suite` lands in a new outputs/<params name>/<timestamp>/ (outputs/<name>/latest points
# at the newest); OUT=dir picks a directory instead.
# Both create .venv on first use: CPU torch first (pip takes the local torch 2.13.0 CPU file where
# the machine has one; set TORCH to another requirement for a GPU host), then perfkit with its
# test extras.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PARAMS ?= params/ci-cpu.yaml
OUT    ?=
PYTEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.perfkit-installed

.PHONY: setup suite test notebooks clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

suite: setup
	$(BIN)/perfkit suite --params $(PARAMS) $(if $(OUT),--out $(OUT))

test: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check src tests benchmarks notebooks
	$(BIN)/ruff format --check src tests benchmarks notebooks
	$(BIN)/python -m pytest $(PYTEST_ARGS)

notebooks: setup
	$(BIN)/python notebooks/make_notebooks.py

clean:
	rm -rf outputs
