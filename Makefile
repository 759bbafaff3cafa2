# Two commands on a fresh machine (python3 + pip only):
#   make demo   set up .venv and run the main job on the CPU default
#   make test   set up .venv and run the whole test suite (what CI runs)
# Both are idempotent: .venv is rebuilt only when pyproject.toml or
# constraints.txt change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast venv constraints clean

# pip compiles the packages' bytecode at install (no --no-compile): every backend
# subprocess imports torch/jax, and without .pyc files (this machine sets
# PYTHONDONTWRITEBYTECODE=1) each import re-parses them: 9.2 s vs 4.5 s measured.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[jax,torch-xla,torchax,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m compare --backend both

# Three test processes (pytest-xdist: one per core and one more, which fills the cores while a test waits on
# a timeout or a lock), handed one test at a time in the order tests/conftest.py sets, longest first
# (xdist's default hands each a quarter of its share at once: the longest tests all went to one process);
# tests/conftest.py gives every process one OpenMP thread. No test judges a timing target (python -m
# benchmarks does, run alone).
test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -n 3 --maxschedchunk 1 --durations=25

test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m 'not slow'

constraints: $(STAMP)
	{ echo "# Exact versions CI installs (pip install -c constraints.txt ...)."; \
	  echo "# Regenerate: make constraints (freezes the working .venv)."; \
	  $(PY) -m pip freeze --exclude-editable | sort -f; } > constraints.txt

clean:
	rm -rf $(VENV) runs
