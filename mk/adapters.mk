# Framework adapters (hpccoll.adapters): install autograd, scipy and torch into the
# venv, then run the adapter and example tests. Without these frameworks the same
# tests skip cleanly in `make test`.

ADAPTER_EXTRAS ?= $(EXTRAS),adapters
ADAPTER_TESTS  := tests/test_adapters.py tests/test_examples_adapters.py
ADAPTER_EXAMPLES := tp_mlp data_parallel_sgd distributed_lstsq adjoint_state

.PHONY: venv-adapters test-adapters examples-adapters

venv-adapters: $(VENV)/.installed-adapters

$(VENV)/.installed-adapters: $(VENV)/.installed setup.cfg pyproject.toml
	$(PY) -m pip install -q -e ".[$(ADAPTER_EXTRAS)]"
	touch $@

## test-adapters: the adapter tests serially (each example launched at 2 ranks), then at 2, 3 and 4 ranks
test-adapters: venv-adapters
	timeout $(TEST_TIMEOUT) $(PY) $(PYTEST) -q $(ADAPTER_TESTS)
	for n in 2 3 4; do timeout $(TEST_TIMEOUT) $(MPIEXEC) -n $$n $(PY) $(PYTEST) -q $(ADAPTER_TESTS) || exit 1; done

## examples-adapters: run the adapter examples at NP ranks (each checks itself against a serial run)
examples-adapters: venv-adapters
	for ex in $(ADAPTER_EXAMPLES); do timeout 300 $(MPIEXEC) -n $(NP) $(PY) -m mpi4py examples/$$ex.py || exit 1; done
