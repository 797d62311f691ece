# Quick start:   make demo   (set up, then run the head-count experiment + head analysis)
#                make test   (set up, then run the test suite)
#
# `make setup` makes .venv and installs mhainterp in it. It installs the CPU build of
# torch first (TORCH, default torch==2.13.0) unless the venv already has a torch, so no
# multi-GB CUDA build is pulled in. Bring your own torch with `make setup TORCH=` after
# installing it into .venv (or use `pip install -e .[dev]` in an environment you manage).

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
OUT    ?= runs/quickstart
BIN    := $(VENV)/bin

.PHONY: setup demo test test-all test-gpu lint clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH)" ] && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH) (CPU build)"; \
		$(BIN)/pip install --quiet "$(TORCH)"; \
	fi
	$(BIN)/pip install --quiet -e ".[dev,explore,explore-test]"
	@touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/mhainterp demo --out $(OUT)

# The fast suite runs on every core (pytest-xdist; a file's tests stay on one worker, so its
# module fixtures are built once). test-all runs everything the same way except the tests that
# send a signal at a chosen moment (marker `signals`): those run after, one at a time, so the
# other tests' load cannot move a Ctrl-C or a kill past the moment it aims at.
test: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test-all: setup
	$(BIN)/python -m pytest -q -m "not signals" -n auto --dist loadfile
	$(BIN)/python -m pytest -q -m signals

# The tests marked `cuda` (the GPU trainer and sweep, the device twins of the CPU tests): run them
# on a machine with a CUDA GPU. Without one they skip, so CI (no GPU) never runs them.
test-gpu: setup
	$(BIN)/python -m pytest -q -m cuda

lint: setup
	$(BIN)/ruff check mhainterp analysis tests
	$(BIN)/ruff format --check mhainterp analysis tests

clean-venv:
	rm -rf $(VENV)
