# Reliability checks (docs/reliability.md): long property sweeps, messages over 2^31 elements,
# memory and leak measurements, the no-check mismatch table, and the soak run.

.PHONY: test-long test-large bench-memory bench-watchdog mismatch-table soak

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

## bench-watchdog: the cost of HPCCOLL_TIMEOUT, with and without, interleaved, at 2 ranks
bench-watchdog: venv
	timeout 900 $(MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/watchdog.py

## soak: random collectives and adjoints checked against NumPy at 4 ranks, check mode on, for SOAK_MINUTES (10)
soak: venv
	timeout $(shell $(PYTHON) -c 'print(int(float("$(SOAK_MINUTES)") * 60 + 300))') \
	  $(MPIEXEC) -n 4 $(PY) -m mpi4py benchmarks/soak.py --minutes $(SOAK_MINUTES)
