# Quick start:   make demo   (set up, then run the head-count experiment + head analysis)
#                make test   (set up, then run the test suite)
#
# `make setup` makes .venv and installs mhainterp in it. It installs torch first (TORCH,
# default torch==2.13.0) unless the venv already has one, from pip's configured index, or
# from TORCH_INDEX when given. Which build that is depends on the index: on stock PyPI (Linux)
# it is the CUDA build (several GB); the CPU build comes from PyTorch's CPU index:
#     make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Bring your own torch with `make setup TORCH=` after installing it into .venv (or use
# `pip install -e .[dev]` in an environment you manage).

PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
OUT    ?= runs/quickstart
BIN    := $(VENV)/bin

.PHONY: setup demo test test-all test-gpu lint clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH)" ] && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH)$(if $(TORCH_INDEX), from $(TORCH_INDEX))"; \
		$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") "$(TORCH)"; \
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

# The tests marked `cuda` (the GPU trainer and sweep, the device twins of the CPU tests), on a
# machine with a CUDA GPU. Without one it says so and fails (a run that skipped every test is
# not a pass). The slow ones (the demo on both devices) run with GPU_SLOW=1. CI has no GPU:
# `make test` runs every entry point on a strict simulated device instead (tests/strict_device.py).
GPU_SLOW ?=
test-gpu: setup
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
		f'make test-gpu: torch {torch.__version__} sees no CUDA device here, so nothing was tested')"
	$(BIN)/python -m pytest -q -m "$(if $(GPU_SLOW),cuda,cuda and not slow)"

lint: setup
	$(BIN)/ruff check mhainterp analysis tests
	$(BIN)/ruff format --check mhainterp analysis tests

clean-venv:
	rm -rf $(VENV)
