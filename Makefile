# perfkit: `make suite` runs the investigation suite on the reference engine, `make test` the tests.
# Each `make suite` lands in a new outputs/<params name>/<timestamp>/ (outputs/<name>/latest points
# at the newest); OUT=dir picks a directory instead.
# Both create .venv on first use: CPU torch first (pip takes the local torch 2.13.0 CPU file where
# the machine has one; set TORCH to another requirement for a GPU host), then perfkit with every
# optional stack (the `all` extra: history, ray, lab) and the test tools.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PARAMS ?= params/ci-cpu.yaml
OUT    ?=
PYTEST_ARGS ?=
#: pytest-xdist workers for the parallel phase of `make test`: one more than the machine's cores.
#: Its tests wait on engines, kernels, Ray and Chromium part of the time: with one worker a core
#: on CI's 2 cores the phase kept 1.55 cores busy (9 min 54 s at 25bc621)
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

BIN := $(VENV)/bin
STAMP := $(VENV)/.perfkit-installed

#: what nbstripout strips besides outputs and counts: the language_info JupyterLab adds on save
NB_EXTRA_KEYS := metadata.language_info.codemirror_mode metadata.language_info.file_extension \
	metadata.language_info.mimetype metadata.language_info.nbconvert_exporter \
	metadata.language_info.pygments_lexer metadata.language_info.version

.PHONY: setup suite test test-sglang test-fast coverage notebooks clean git-filter sglang-env

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e '.[all,test]'
	$(MAKE) git-filter
	touch $@

# nbstripout as a git filter (this clone's .git/config; .gitattributes is committed): a notebook
# saved from JupyterLab with its outputs reads as unchanged to git (git status stays clean)
git-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  $(BIN)/nbstripout --install --attributes .gitattributes && \
	  git config filter.nbstripout.extrakeys "$(NB_EXTRA_KEYS)" && \
	  echo "nbstripout git filter installed: notebooks are committed without outputs"; \
	else echo "not a git clone: no nbstripout filter"; fi

suite: setup
	$(BIN)/perfkit suite --params $(PARAMS) $(if $(OUT),--out $(OUT))

test: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check src tests benchmarks notebooks
	$(BIN)/ruff format --check src tests benchmarks notebooks
	@# two phases: first the `timing` tests alone on the machine (a live A/B must decide +30 %;
	@# run first, while the runner is fresh: after minutes of saturation a shared VM's CPU slows),
	@# then the rest on $(TEST_WORKERS) workers (a module is one work unit, tests/conftest.py: its
	@# engine launches run once, on one worker); both always run, and either failing fails the target
	@# bytecode cached (PYTHONDONTWRITEBYTECODE, set by many images, unset here): with it set,
	@# each of the run's ~1,000 Python processes (kernels, engines, CLIs) compiled perfkit's
	@# modules again (0.2 s a process) and each pytest rewrote every test module's asserts
	@rc=0; unset PYTHONDONTWRITEBYTECODE; \
	$(BIN)/python -m pytest -m "timing and not sglang" $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not timing and not sglang" $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

# the conformance tier: perfkit's investigations against the live real sglang 0.5.23 server
# (tests marked `sglang`, left out of `make test`), with the venv `make sglang-env` made; a
# missing venv is an error here (PERFKIT_REQUIRE_SGLANG=1), a skip elsewhere. Verdicts and wall
# times: outputs/sglang-tier/verdicts.json
SGLANG_VENV ?= .sglang-venv
test-sglang: setup
	unset PYTHONDONTWRITEBYTECODE; \
	PERFKIT_REQUIRE_SGLANG=1 SGLANG_VENV=$(SGLANG_VENV) $(BIN)/python -m pytest -m sglang $(PYTEST_ARGS)

# line coverage of src/perfkit (pytest-cov; the perfkit, papermill-kernel and engine subprocesses
# too, through coverage's subprocess patch in pyproject.toml): the same two phases as `make test`,
# the second appending; htmlcov/index.html and coverage.json. Not part of `make test` (slower).
coverage: setup
	rm -f .coverage .coverage.*
	@rc=0; \
	$(BIN)/python -m pytest -m "timing and not sglang" --cov --cov-report= $(PYTEST_ARGS) || rc=$$?; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not timing and not sglang" --cov --cov-append \
	  --cov-report=term:skip-covered --cov-report=html --cov-report=json $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

# the inner loop: the tests that launch no engine and run no papermill, on every core (~minutes)
test-fast: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not timing and not sglang" $(PYTEST_ARGS)

#: real sglang 0.5.23 (CPU diffusion server) in its own venv, apart from .venv: docs/sglang.md.
#: Cached on the pins in deploy/sglang-requirements.txt; SGLANG_VENV=path puts it elsewhere
sglang-env:
	SGLANG_VENV=$(SGLANG_VENV) PYTHON=$(PYTHON) deploy/sglang-env.sh

notebooks: setup
	$(BIN)/python notebooks/make_notebooks.py

clean:
	rm -rf outputs htmlcov .coverage .coverage.* coverage.json
