# Quickstart: `make run` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
BUILD  := build

# Open MPI from PyPI: allow root (containers, CI) and oversubscription on small hosts.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe
export OMPI_MCA_rmaps_base_oversubscribe := 1
# no InfiniBand here: skip Open MPI's UCX one-sided component (it only prints errors)
export OMPI_MCA_osc ?= ^ucx
# numba's on-disk cache of compiled kernels, kept out of the source tree.
export NUMBA_CACHE_DIR ?= $(CURDIR)/$(BUILD)/numba-cache
# Python's bytecode caches (__pycache__, git-ignored) are written even where the host turns
# them off: without them every test process compiles each module it imports from source,
# and each pytest worker rewrites every test file's asserts again (2-core VM: `make unit`
# spent 28 CPU-s more, a worker's collection 15 CPU-s instead of 6).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test lint unit kernel-signatures mpi bench clean

TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min((os.cpu_count() or 1) + 1, 5))")
COLLECTIVES = $(BIN)/mpiexec -n 2 $(BIN)/python -m pytest -q -rs -p no:cacheprovider \
	--with-mpi tests/test_collectives.py

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/lmdbio demo --workdir $(BUILD)/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The quick loop: every test that starts no mpiexec job (an unmarked one that does fails)
# and is not marked slow (fuzzers, long property tests, whole CLI jobs in subprocesses:
# `make test` runs them), on up to 4 cores (pytest-xdist), by test file (a file's module
# fixtures are built once). First the kernels these tests call are compiled into numba's
# cache, once each, on all cores (tests/precompile_kernels.py), so the workers only load
# them instead of compiling at first calls, some in both. Fresh clone on the 2-core VM
# (2026-11-28, after setup, 3 runs): 60-64 s, then the tests 46-54 s, 108-119 s in all
# (129-131 s with IBP's parfors decoders, 115 signatures; at first 91 s + 75 s); a second
# time the step returns at once and the tests take ~48 s (was 74 s).
UNIT_TESTS = LMDBIO_TESTS_WITHOUT_MPIEXEC=1 $(BIN)/python -m pytest -q -rs -p no:cacheprovider \
	-n auto --maxprocesses 4 --dist loadfile -m "not mpiexec and not slow" tests

unit: setup
	$(BIN)/python -m tests.precompile_kernels
	$(UNIT_TESTS)

# Write tests/kernel_signatures.json (what `make unit` precompiles) again, after kernels or
# the tests that call them changed: the unit tests run on an empty cache and record each
# kernel signature they compile and its CPU time.
KERNEL_COMPILES = $(CURDIR)/$(BUILD)/kernel-compiles
kernel-signatures: setup
	rm -rf $(KERNEL_COMPILES) && mkdir -p $(KERNEL_COMPILES)
	NUMBA_CACHE_DIR=$(KERNEL_COMPILES)/cache LMDBIO_RECORD_KERNEL_COMPILES=$(KERNEL_COMPILES) \
		$(UNIT_TESTS)
	$(BIN)/python -m tests.precompile_kernels --record $(KERNEL_COMPILES)

# The MPI jobs: tests that start mpiexec (two at a time: most of a job's time is spent
# starting and waiting, not computing; a test file's jobs stay on one worker, since
# several share a module-scoped job), then the collective tests pytest-mpi runs inside
# every rank of one job.
mpi: setup
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile -m mpiexec tests
	$(COLLECTIVES)

# Everything, in one pytest session so that the MPI jobs fill the cores the unit tests
# leave idle (by file, as in `make mpi`), then the collective tests. What CI runs. One
# worker more than the cores (at most 5): an MPI job's ranks mostly wait, and yield their
# core while they do (fresh clone on the 2-core VM: 3 workers 475 s, 2 workers 504 s).
# The unit tests' kernels are compiled first, as in `make unit`.
test: lint
	$(BIN)/python -m tests.precompile_kernels
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n $(TEST_WORKERS) \
		--dist loadfile tests
	$(COLLECTIVES)

bench: setup
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench.run_all --out bench/results

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
