# The two commands a newcomer needs:  `make lab`  and  `make test`.
# Everything installs into .venv; nothing touches the system Python.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Where there is no NVIDIA GPU, torch is installed as a CPU build first, so that the looser
# `torch` requirement of the package never pulls a multi-GB CUDA build. Elsewhere, point pip
# at PyTorch's CPU wheels with, for example:
#   make test TORCH_CPU="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_CPU ?= torch==2.13.0
PORT ?= 8888

.PHONY: setup lab test check lint book exercises screenshots bench bench-kernels bench-grading gpu-check \
        doctor wheel hub clean

# The environment is (re)built when the dependency lists in pyproject.toml change, not when
# anything else in it does (`python -m autograder repository URL` rewrites its URL).
DEPENDENCIES := $(shell sed -n '/^dependencies = \[/,/^\]/p; /^\[project.optional-dependencies\]/,/^\[tool/p' pyproject.toml | cksum | cut -d' ' -f1)
INSTALLED := $(VENV)/.installed-$(DEPENDENCIES)

# JupyterHub's proxy (configurable-http-proxy) comes from npm, as hub/package-lock.json pins it.
PROXY := hub/node_modules/.package-lock.json

setup: $(INSTALLED) $(PROXY)

# Everything is installed by uv, which links packages from its cache and compiles them on
# every core, where pip unpacks and compiles each wheel afresh on one (a fresh setup here: 88 s
# with pip, 68 s with uv for all but torch, 36 to 40 s with torch too). uv reads its own settings,
# not pip's: every command make runs (setup, and the tests' own uv) is given the index pip
# would use (PIP_INDEX_URL, else pip's configured global.index-url) unless UV_DEFAULT_INDEX is
# set, so that a mirror set for pip serves both; and the CPU build of torch is the wheel pip
# finds for $(TORCH_CPU), downloaded first.
PIP_INDEX := $(or $(PIP_INDEX_URL),$(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null))
ifneq ($(PIP_INDEX),)
export UV_DEFAULT_INDEX ?= $(PIP_INDEX)
endif
TORCH_WHEEL := $(VENV)/torch-cpu

$(INSTALLED):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip 'uv>=0.9'
	rm -rf $(TORCH_WHEEL)
	@if nvidia-smi -L >/dev/null 2>&1; then \
	    echo "NVIDIA GPU found: torch comes from the package requirements"; \
	else \
	    echo "No NVIDIA GPU: installing the CPU build of torch ($(TORCH_CPU))"; \
	    $(BIN)/python -m pip download --quiet --no-deps --dest $(TORCH_WHEEL) $(TORCH_CPU); \
	fi
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode \
	    $$(find $(TORCH_WHEEL) -name 'torch-*.whl' 2>/dev/null) -e '.[grader,dev,hub,cluster,book]'
	rm -rf $(TORCH_WHEEL)
	$(BIN)/python -m course doctor
	rm -f $(VENV)/.installed*
	touch $@

# Only the class hub needs npm: without it, setup says so and the hub test skips (outside CI).
$(PROXY): hub/package-lock.json
	@if command -v npm >/dev/null; then \
	    npm ci --prefix hub --no-audit --no-fund; \
	else \
	    echo "no npm: the class hub needs Node.js and npm (apt-get install -y nodejs npm)"; \
	fi

# JupyterLab refuses to run as root unless told to (containers, cloud VMs).
lab: setup
	$(BIN)/jupyter lab --notebook-dir=. --port=$(PORT) \
	    $(if $(filter 0,$(shell id -u)),--allow-root) exercises/01_kv_cache_sizing.ipynb

# The suite runs on every core (pytest-xdist), each test a unit of its own except those that
# share a fixture built once per module (a graded class, a built wheel, a JupyterLab): those
# run together on one worker (tests/conftest.py schedules them: --dist loadscope).
WORKERS ?= logical

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope

# The quick tier, for the edit-test loop (a few minutes): lint, the tests that run no whole
# notebook, no browser, no hub and no one-wrong-TODO sweep, then chapter 1 through the whole
# grading pipeline in English and Chinese. `make test` runs everything (CI).
QUICK := not pipeline and not notebook and not browser and not hub and not one_wrong_todo

check: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -m "$(QUICK)"
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -k 01_kv_cache_sizing \
	    tests/test_grading.py tests/test_zh_grading.py

lint: setup
	$(BIN)/ruff check .

# The web edition: every chapter run (cached in .book-cache/) and built, in English and Chinese,
# into a static site; the last line printed is its index.html.
book: setup
	$(BIN)/python -m autograder book build/book

# Regenerate the learner notebooks in exercises/ from solutions/ with nbgrader.
exercises: setup
	$(BIN)/python -m autograder release

# The README's pictures, taken by the browser tests (needs Chromium: apt-get install chromium).
screenshots: setup
	KV_SCREENSHOTS=docs/images $(BIN)/python -m pytest tests/test_browser.py

# Benchmarks print figures; they are not tests.
bench: setup
	$(BIN)/python -m course.experiments.bench

# Chapter 7's kernel on a GPU (refuses on a CPU); writes kernels/results/<GPU>.json.
bench-kernels: setup
	$(BIN)/python -m kernels.bench

# Notebooks graded per minute for a synthetic class of 50 (about 15 minutes on 2 cores).
bench-grading: setup
	$(BIN)/python -m autograder.builder.bench --learners 50 --jobs 1 2

# On a GPU machine: the GPU tests (production shapes), then the kernel benchmark.
gpu-check: setup
	$(BIN)/python -m pytest -m gpu -rs
	$(BIN)/python -m kernels.bench

doctor: setup
	$(BIN)/python -m course doctor

wheel: setup
	$(BIN)/python -m pip wheel --no-deps --wheel-dir dist .

# A JupyterHub for a class on this machine (hub/README.md), for example:
#   make hub HUB_ARGS="--chapters 1-3 --exchange /srv/nbgrader/exchange"
hub: setup
	$(BIN)/python hub/launch.py $(HUB_ARGS)

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache .ruff_cache hub/node_modules
