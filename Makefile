# hpccoll — make targets. `make test` and `make demo` work on a fresh machine:
# they create .venv on first use and install hpccoll editable with the
# mpich and test extras (MPICH's mpiexec lands in .venv/bin).

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
MPIEXEC  ?= $(VENV)/bin/mpiexec
EXTRAS   ?= mpich,test
# Each MPI run of the suite is killed after this many seconds instead of hanging.
TEST_TIMEOUT ?= 600
PYTEST   := -m mpi4py -m pytest --with-mpi -p no:cacheprovider
NP       ?= 4

.PHONY: venv demo test test-serial test-mpi bench-quick lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

## demo: each collective and its adjoint across 4 MPI ranks, checked against NumPy
demo: venv
	timeout 300 $(MPIEXEC) -n 4 $(PY) -m mpi4py examples/quickstart.py

## test: the suite serially, then at 2, 3 and 4 ranks
test: test-serial test-2 test-3 test-4

test-serial: venv
	timeout $(TEST_TIMEOUT) $(PY) $(PYTEST) tests

## test-N: the suite at N ranks (python -m mpi4py turns an uncaught exception into MPI_Abort)
test-%: venv
	timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $* $(PY) $(PYTEST) -q tests

## bench-quick: hpccoll over raw mpi4py, side by side, at 2 ranks
bench-quick: venv
	timeout 900 $(MPIEXEC) -n 2 $(PY) benchmarks/bench_quick.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info

# Topic make fragments (jobs, GPU, adapters, ...) live in mk/.
-include mk/*.mk
