# One command sets up and runs the main job (`make demo`); one sets up and runs the tests
# (`make test`). Either order, in one clone: both install from uv.lock into .venv, the demo's
# set being a subset of the tests' (the lock resolves every extra and group together).
# Needs Python 3.12 or newer: the first of python3.12, python3.13, python3.14 (through pyenv, or
# on PATH) and python3 (on PATH) that is at least 3.12; or make PYTHON=/path/to/python3.
IS_312 := import sys; sys.exit(sys.version_info < (3, 12))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for v in 3.12 3.13 3.14; do \
    for p in "$$(PYENV_VERSION=$$v pyenv which python$$v 2>/dev/null)" "$$(command -v python$$v)"; do \
      [ -n "$$p" ] && "$$p" -c '$(IS_312)' 2>/dev/null && { echo "$$p"; exit; }; \
    done; done; \
  p="$$(command -v python3)" && "$$p" -c '$(IS_312)' 2>/dev/null && echo "$$p")
endif
NO_PYTHON := Python 3.12 or newer not found (python3.12, python3.13, python3.14 or python3, on \
  PATH or through pyenv): install one (pyenv install 3.12) or run make PYTHON=/path/to/python3
OLD_PYTHON := $(PYTHON) is not Python 3.12 or newer: install one (pyenv install 3.12) or run \
  make PYTHON=/path/to/python3.12
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
export UV_PYTHON := $(PYTHON)
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
# Python caches the venv's bytecode (a machine may turn that off for everything): otherwise every
# fresh interpreter compiles ART and torch again (`import art`: 21 s, 14 s from the cache).
unexport PYTHONDONTWRITEBYTECODE
TEST_SET := --all-extras --group test --group docs

.PHONY: setup setup-test demo test lint docs bench lock test-latest test-vllm clean

# uv itself, pinned, in its own small venv (so syncing .venv never removes it).
# The Python checks are make's own errors (one line, nothing run), raised when uv is needed.
$(UV):
	$(if $(PYTHON),,$(error $(NO_PYTHON)))
	$(if $(shell "$(PYTHON)" -c '$(IS_312)' 2>/dev/null && echo ok),,$(error $(OLD_PYTHON)))
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q uv==$(UV_VERSION)

# The package with the CPU backend the demo trains on (torch, transformers), as locked; keeps
# what `make test` added.
setup: $(UV)
	$(UV) sync --locked --inexact --extra cpu

# Everything the tests, lint and docs need, as locked; `pip check` must be clean.
setup-test: $(UV)
	$(UV) sync --locked $(TEST_SET)
	$(UV) pip check --python $(BIN)/python

demo: setup
	$(BIN)/arttrace demo

# ruff, and the layering (CONTRIBUTING.md) held by import-linter's contracts in pyproject.toml.
LINT := $(BIN)/ruff check src tests bench examples docs && \
  $(BIN)/ruff format --check src tests bench examples docs/_ext && \
  $(BIN)/lint-imports --no-cache

lint: setup-test
	$(LINT)
	$(BIN)/mypy

docs: setup-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The viewer's browser tests drive Debian's chromium (nothing downloads a browser of its own).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	$$sudo apt-get install -y -q --no-install-recommends chromium || \
	  { $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends chromium; }

# The lint as `make lint`, mypy (about 40 s cold, one core) beside the tests, not before them.
# The suite keeps about one core busy on average (servers, subprocesses, a browser, a Ray
# cluster wait more than they compute): it runs as three pytest processes side by side (the
# slowest folders and files; the gateway, translation, integrations and import-order tests; the
# rest), and mypy beside them.
SIDE_TESTS := tests/executors tests/viewer tests/store tests/exports \
  tests/training/test_cpu_backend.py tests/app/test_docs.py tests/app/test_notebook.py
LANE_TESTS := tests/gateway tests/translation tests/integrations tests/capture/test_import_order.py

test: setup-test $(CHROMIUM)
	$(LINT)
	$(BIN)/mypy > .mypy.out 2>&1 & mypy=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider $(SIDE_TESTS) > .pytest-side.out 2>&1 & side=$$!; \
	$(BIN)/pytest -q -p no:cacheprovider $(LANE_TESTS) > .pytest-lane.out 2>&1 & lane=$$!; \
	$(BIN)/pytest -q $(foreach f,$(SIDE_TESTS) $(LANE_TESTS),--ignore=$(f)); tests=$$?; \
	wait $$side; side_tests=$$?; echo "$(SIDE_TESTS):"; cat .pytest-side.out; \
	wait $$lane; lane_tests=$$?; echo "$(LANE_TESTS):"; cat .pytest-lane.out; \
	wait $$mypy; typed=$$?; cat .mypy.out; rm -f .mypy.out .pytest-side.out .pytest-lane.out; \
	[ $$tests = 0 ] && [ $$side_tests = 0 ] && [ $$lane_tests = 0 ] && [ $$typed = 0 ]

bench: setup-test
	$(BIN)/python bench/bench_import.py
	$(BIN)/python bench/bench_capture.py
	$(BIN)/python bench/bench_trainer.py
	$(BIN)/python bench/bench_transport.py --quick
	$(BIN)/python bench/bench_gateway.py --quick
	$(BIN)/python bench/bench_scale.py --quick
	$(BIN)/python bench/bench_continuity.py
	$(BIN)/python bench/bench_translation.py --quick
	$(BIN)/python bench/bench_rewards.py --rounds 2
	$(BIN)/python bench/bench_start.py --rounds 1

# After changing dependencies in pyproject.toml.
lock: $(UV)
	$(UV) lock

# Not part of `make test`: the newest releases the version ranges allow, in their own venv,
# to see what a new release breaks before the lock moves.
test-latest: $(UV)
	rm -rf .venv-latest
	$(UV) venv -q .venv-latest
	$(UV) pip install -q --python .venv-latest/bin/python --upgrade -e ".[all]" --group test --group docs
	$(UV) pip check --python .venv-latest/bin/python || true
	@echo "versions that differ from uv.lock:"
	@$(UV) pip freeze --python .venv-latest/bin/python --exclude-editable | \
	  $(PYTHON) .ci/lock_diff.py uv.lock
	.venv-latest/bin/pytest -q -p no:cacheprovider

# Not part of `make test`: the capture contract (tests_vllm/) against a real vLLM server on the
# CPU, built by .ci/vllm/run.sh in its own Python 3.11 venv (.venv-vllm, reused once built).
test-vllm: setup-test
	.ci/vllm/run.sh

clean:
	rm -rf $(VENV) .venv-latest $(TOOLS) runs site .pytest_cache .mypy_cache .ruff_cache
