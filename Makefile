# Two commands on a fresh machine (python3 + pip only):
#   make demo   set up .venv and run the main job on the CPU default
#   make test   set up .venv and run the whole test suite (what CI runs)
# Both are idempotent: .venv is rebuilt only when pyproject.toml or
# constraints.txt change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-cpu demo-gpu demo-tpu test test-fast docs docs-reference venv constraints constraints-gpu constraints-tpu clean

# PLATFORM=tpu (make demo PLATFORM=tpu, on a TPU VM): jax[tpu] and torch_xla[tpu] pin different libtpu releases,
# so each gets an environment of its own, pinned like the CPU one; compare runs in the jax one (it imports no
# framework) and is told which interpreter runs which backend.
# PLATFORM=gpu (an NVIDIA GPU machine): JAX's CUDA wheels and PyPI's CUDA build of torch share one environment;
# it runs JAX, eager torch and torchax on the GPU (PyPI has no CUDA build of torch_xla).
PLATFORM ?= cpu
ifeq ($(filter $(PLATFORM),cpu gpu tpu),)
$(error PLATFORM=$(PLATFORM) is not a platform of make demo: use cpu (the default), gpu or tpu)
endif
GPU := .venv-gpu
TPU_JAX := .venv-tpu-jax
TPU_TORCH_XLA := .venv-tpu-torch-xla

# pip compiles the packages' bytecode at install (no --no-compile): every backend
# subprocess imports torch/jax, and without .pyc files (this machine sets
# PYTHONDONTWRITEBYTECODE=1) each import re-parses them: 9.2 s vs 4.5 s measured.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[jax,torch-xla,torchax,dev]'
	touch $(STAMP)

venv: $(STAMP)

# This checkout's own modules compiled once (into __pycache__, ignored by git), as pip compiles an
# installed wheel's: with PYTHONDONTWRITEBYTECODE=1 (set on the developers' machines and CI's)
# every process compiled the ~150 it imports from source again, ~0.15 CPU-s each (measured; the
# suite starts ~1,300 processes). Reading bytecode is unaffected by that variable; a module edited
# since is compiled again, in memory, as before. 0.5 s the first time, 0.25 s when up to date;
# quiet but for a file that does not compile, which it names.
SOURCES := analysis benchmarks common compare driver examples jax_impl preload tests torch_impl \
	torch_xla_impl torchax_impl
BYTECODE := $(PY) -m compileall -q -j 0 $(SOURCES)

demo: demo-$(PLATFORM)

demo-cpu: $(STAMP)
	$(BYTECODE)
	$(PY) -m compare --backend both

# the hardware is checked before anything is installed: the CUDA stack is gigabytes
$(GPU)/.installed: pyproject.toml constraints-gpu.txt
	@ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { echo "error: make demo PLATFORM=gpu needs an NVIDIA GPU, and this machine has none (no /dev/nvidiaN); use PLATFORM=cpu"; exit 2; }
	$(PYTHON) -m venv $(GPU)
	$(GPU)/bin/pip install --quiet -c constraints-gpu.txt -e '.[gpu]'
	touch $@

# the GPU default: GPT-2 small (124M) in bfloat16 on one card, every runtime PyPI has a CUDA build of
demo-gpu: $(GPU)/.installed
	$(GPU)/bin/python -m compare --backend jax,torch,torchax --spec gpt2-small --dtype bfloat16 --require-same-device

$(TPU_JAX)/.installed: pyproject.toml constraints-tpu-jax.txt
	@ls /dev/accel[0-9]* /dev/vfio/[0-9]* >/dev/null 2>&1 || { echo "error: make demo PLATFORM=tpu runs on a TPU VM, and this machine has no TPU (no /dev/accelN or /dev/vfio/N); use PLATFORM=cpu"; exit 2; }
	$(PYTHON) -m venv $(TPU_JAX)
	$(TPU_JAX)/bin/pip install --quiet -c constraints-tpu-jax.txt -e '.[tpu-jax]'
	touch $@

$(TPU_TORCH_XLA)/.installed: pyproject.toml constraints-tpu-torch-xla.txt
	$(PYTHON) -m venv $(TPU_TORCH_XLA)
	$(TPU_TORCH_XLA)/bin/pip install --quiet -c constraints-tpu-torch-xla.txt -e '.[tpu-torch-xla]'
	touch $@

# the TPU default: GPT-2 small (124M) in bfloat16, judged against each backend's own float32 run
demo-tpu: $(TPU_JAX)/.installed $(TPU_TORCH_XLA)/.installed
	$(TPU_JAX)/bin/python -m compare --backend both --spec gpt2-small --dtype bfloat16 \
	    --jax-python $(TPU_JAX)/bin/python --torch-xla-python $(TPU_TORCH_XLA)/bin/python

# One test process per core and one more (pytest-xdist; the extra one fills the cores while a test
# waits on a timeout or a lock: 3 on the developers' 2 cores), handed one test at a time in the order
# tests/conftest.py sets, longest first (xdist's default hands each a quarter of its share at once: the
# longest tests all went to one process); tests/conftest.py gives every process one OpenMP thread. No
# test judges a timing target (python -m benchmarks does, run alone). Bounded by the memory available
# (tests/workers.py: 3 GiB each). TEST_PROCESSES=N overrides.
TEST_PROCESSES ?= $(shell python3 -m tests.workers)
# The suite's compile caches (and its measured CPU peak) kept between runs in .test-cache/ (ignored
# by git; tests/helpers.py): a second run loads the JAX programs the first compiled, 37:07 -> 25:05
# of pytest measured at stop 73. A clean clone (CI) starts with none; TEST_CACHE= (empty): a fresh
# cache each run, removed after it.
TEST_CACHE ?= $(CURDIR)/.test-cache
test: $(STAMP)
	$(BYTECODE)
	XLA_TWINS_TEST_CACHE_HOME="$(TEST_CACHE)" $(PY) -m pytest -p no:cacheprovider -n $(TEST_PROCESSES) --maxschedchunk 1 --durations=25

# Two test processes: no backend runs (tests/conftest.py's guard fails the session if one starts, in either)
test-fast: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -p no:cacheprovider -n 2 -m 'not slow'

# the docs site (MkDocs, Material theme) into site/; --strict: a broken link or page fails it
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# the reference pages generated from the code (tests/test_docs_reference.py holds them in sync)
docs-reference: $(STAMP)
	$(PY) -m compare.docs_reference

constraints: $(STAMP)
	{ echo "# Exact versions CI installs (pip install -c constraints.txt ...)."; \
	  echo "# Regenerate: make constraints (freezes the working .venv)."; \
	  $(PY) -m pip freeze --exclude-editable | sort -f; } > constraints.txt

# The GPU and TPU pins, resolved by pip on any machine (no accelerator needed: nothing is installed), e.g. CPU CI's
constraints-gpu: $(STAMP)
	$(PY) -m tests.platforms gpu constraints-gpu.txt

constraints-tpu: $(STAMP)
	$(PY) -m tests.platforms tpu-jax constraints-tpu-jax.txt
	$(PY) -m tests.platforms tpu-torch-xla constraints-tpu-torch-xla.txt

clean:
	rm -rf $(VENV) $(GPU) $(TPU_JAX) $(TPU_TORCH_XLA) runs .test-cache
