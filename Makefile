# One command sets up and runs the main job (`make demo`); one sets up and runs the tests (`make test`).
# Needs Python 3.12: found on PATH, or through pyenv (PYENV_VERSION=3.12 pyenv which python3.12).
PYTHON ?= $(shell PYENV_VERSION=3.12 pyenv which python3.12 2>/dev/null || command -v python3.12 2>/dev/null)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test demo test lint bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null || { \
	  echo "Python 3.12 not found: install it (pyenv install 3.12) or run make PYTHON=/path/to/python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q -e .

setup-test: $(BIN)/python
	$(BIN)/pip install -q -e ".[all,test]"
	$(BIN)/pip check

demo: setup
	$(BIN)/arttrace demo

lint: setup-test
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy

test: setup-test lint
	$(BIN)/pytest -q

bench: setup-test
	$(BIN)/python bench/bench_capture.py
	$(BIN)/python bench/bench_trainer.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
