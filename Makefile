# `make demo` and `make test` work from a fresh clone: they create .venv and install everything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs wheel-test clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU build on this machine; an unpinned torch would pull CUDA wheels.
	$(BIN)/pip install --quiet -c constraints.txt torch
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,postgres]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/yt8m demo --output_dir demo_output

# Tests in parallel processes, one per core up to 4 (most wait on subprocesses, files and sockets as much as on
# the CPU): 1,560 tests in about 22 minutes on 2 cores.
test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check src
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4

# The documentation site into site/ (mkdocs.yml; docs/hooks.py writes the command reference from the parsers).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

wheel-test:  # the wheel, installed without extras in a fresh venv, runs the workflow (.ci/wheel_test.sh)
	PYTHON=$(PYTHON) bash .ci/wheel_test.sh

clean:
	rm -rf $(VENV) demo_output site
