"""The tests' own MPI launcher (tests/launch.py): a clean child environment, the flags each MPI needs, timeouts."""

import os
import sys

import launch
import pytest
from mpi4py import MPI

serial_only = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")


def test_child_env_drops_the_parent_jobs_variables(monkeypatch):
    job = {
        "PMI_RANK": "3",
        "PMIX_RANK": "3",
        "HYDI_CONTROL_FD": "7",
        "OMPI_COMM_WORLD_RANK": "3",
        "PRTE_LAUNCHED": "1",
        "HPCCOLL_TIMEOUT": "5",
    }
    user = {
        "OMPI_MCA_btl": "self,vader",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
        "PMIX_MCA_gds": "hash",
        "MY_SETTING": "kept",
    }
    for k, v in {**job, **user}.items():
        monkeypatch.setenv(k, v)
    env = launch.child_env({"EXTRA": "1"}, drop=("HPCCOLL_",))
    assert not set(job) & set(env), sorted(set(job) & set(env))
    assert all(env[k] == v for k, v in user.items()) and env["EXTRA"] == "1"
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    env = launch.child_env()
    as_root_openmpi = launch.mpi_flavour() == "openmpi" and os.geteuid() == 0
    pair = {k: env.get(k) for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")}
    assert pair == ({k: "1" for k in pair} if as_root_openmpi else {k: None for k in pair})


def test_the_flavour_is_this_processs_library():
    lib = MPI.Get_library_version()
    want = (
        "openmpi" if "Open MPI" in lib else "mpich" if any(n in lib for n in ("MPICH", "Intel", "MVAPICH")) else "other"
    )
    assert launch.mpi_flavour() == want


def test_more_ranks_than_cores_oversubscribe_on_open_mpi_only():
    if launch.find_mpiexec() is None:
        pytest.skip("no mpiexec")
    cmd = launch.mpiexec_command(64, ["true"])
    assert ("--oversubscribe" in cmd) == (launch.mpi_flavour() == "openmpi")
    assert cmd[-3:] == ["-n", "64", "true"] and cmd[0] == launch.find_mpiexec()


@serial_only
def test_a_job_runs_and_a_hung_job_is_ended_with_its_output():
    proc = launch.run_mpiexec(2, [sys.executable, "-c", "print('hello from a rank', flush=True)"], timeout=60)
    assert proc.stdout.count("hello from a rank") == 2
    code = "import sys, time; print('about to hang', flush=True); time.sleep(600)"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 3 s.*about to hang"):
        launch.run_mpiexec(1, [sys.executable, "-c", code], timeout=3)
    with pytest.raises(pytest.fail.Exception, match="exit status 3"):
        launch.run_mpiexec(1, [sys.executable, "-c", "import sys; sys.exit(3)"], timeout=60)
