# Two commands for a fresh machine: `make train` and `make test`. Both create .venv and install pinned
# dependencies first (torch 2.13.0 CPU comes from the wheel already on this machine kind's disk).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup train test test-fast test-scale clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -r requirements.lock
	$(VPY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VPY) train.py $(ARGS)

# pytest-xdist workers (one per core); --dist loadgroup keeps each xdist_group (tests sharing a module fixture or
# the local Slurm cluster) on one worker. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= auto

test: $(STAMP)
	$(VPY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadgroup -m "not scale" $(PYTEST_ARGS)

# nightly-style: the whole parity matrix (2- and 4-process layouts, both backends), checkpoints resumed at another
# layout, the two-node Slurm job
test-scale: $(STAMP)
	$(VPY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadgroup -m scale $(PYTEST_ARGS)

# unit tests only: no subprocess, no trainer, no process group (tests/conftest.py holds them to it)
test-fast: $(STAMP)
	$(VPY) -m pytest -q -m "not e2e and not slow and not slurm and not scale" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs multirun
