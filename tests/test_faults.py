"""Faults: a rank that fails or never arrives ends the whole job promptly, it does not hang it.

The jobs that must die are launched as subprocesses (``mpiexec -n 2``) from the
serial run only: a size-dependent skip, the same on every rank, with no
collective around it.
"""

import os
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import all_ranks, raises_everywhere
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll
from hpccoll import ArgumentError, _settings
from hpccoll._faults import TIMEOUT_EXIT_CODE
from hpccoll.transports import Selector

#: The issue's bound: the whole job exits non-zero within this many seconds instead of hanging.
LIMIT = 30.0

serial_only = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")


def launch(body, *, module=True, env=None, n=2):
    """Run ``body`` under ``mpiexec -n n`` (``python -m mpi4py -c`` when ``module``); (status, seconds, output).

    The code goes on the command line, not in a file under pytest's tmp_path: on a machine where several
    suites run at once (as root), pytest rotates /tmp/pytest-of-root/ under the others' feet.
    """
    args = [sys.executable] + (["-m", "mpi4py"] if module else []) + ["-c", textwrap.dedent(body)]
    start = time.monotonic()
    proc = run_mpiexec(n, args, env=env, drop=("HPCCOLL_",), timeout=3 * LIMIT, check=False)  # a hang fails the test
    return proc.returncode, time.monotonic() - start, proc.stdout + proc.stderr


RAISES_BEFORE_A_COLLECTIVE = """
    import numpy as np
    import hpccoll
    {setup}
    comm = hpccoll.Communicator()
    if comm.rank == 1:
        raise RuntimeError("rank 1 fails before the collective")
    hpccoll.all_reduce(np.ones(3), comm)  # rank 0 waits here for rank 1
    print("rank", comm.rank, "finished")
"""


@serial_only
def test_an_exception_on_one_rank_aborts_the_job_under_python_m_mpi4py():
    status, seconds, output = launch(RAISES_BEFORE_A_COLLECTIVE.format(setup=""))
    assert status != 0 and seconds < LIMIT, (status, seconds, output)
    # (mpi4py calls Abort straight after printing the traceback: the launcher does not always
    # forward it first, so only the job's end is asserted here; hpccoll's own hook waits for it)
    assert "finished" not in output
    print(f"python -m mpi4py: exit status {status} after {seconds:.1f} s")


@serial_only
def test_abort_on_exception_does_the_same_for_plain_python():
    """Launched as ``python script.py`` (no ``-m mpi4py``) such a job hangs; ``abort_on_exception`` ends it."""
    body = RAISES_BEFORE_A_COLLECTIVE.format(setup="hpccoll.abort_on_exception(errorcode=3)")
    status, seconds, output = launch(body, module=False)
    assert status == 3 and seconds < LIMIT, (status, seconds, output)
    assert "rank 1 fails before the collective" in output  # the traceback is still printed
    print(f"abort_on_exception: exit status {status} after {seconds:.1f} s")


STUCK = """
    import numpy as np
    import hpccoll
    comm = hpccoll.Communicator(check={check})
    last = comm.rank == comm.size - 1
    if {cotangent}:
        # the last rank says its cotangent is replicated (no communication), the others that theirs vary
        hpccoll.all_reduce_adjoint(np.ones(2), comm, cotangent="replicated" if last else "varying")
    elif not last:
        hpccoll.all_gather(np.ones(2), comm, sizes=[2] * comm.size)
    print("rank", comm.rank, "past the collective", flush=True)
"""


@serial_only
@pytest.mark.parametrize(
    "check,cotangent,where",
    [(False, False, "MPI_Allgather"), (True, False, "cross-rank check"), (False, True, "MPI_Allreduce")],
    ids=["missing-rank", "missing-rank-check-mode", "cotangent-conventions-differ"],
)
def test_watchdog_aborts_a_stuck_collective(check, cotangent, where):
    """HPCCOLL_TIMEOUT=0.5: the stuck ranks abort the job (status 124), naming what they waited for."""
    body = STUCK.format(check=check, cotangent=cotangent)
    status, seconds, output = launch(body, env={"HPCCOLL_TIMEOUT": "0.5"})
    assert status == TIMEOUT_EXIT_CODE and seconds < LIMIT, (status, seconds, output)
    assert "did not complete within HPCCOLL_TIMEOUT=0.5 s" in output and where in output, output
    print(f"watchdog: exit status {status} after {seconds:.1f} s")


NEVER_ARRIVES = """
    import time
    import numpy as np
    import hpccoll

    def waiting_for_the_others(comm):
        return hpccoll.all_reduce(np.ones(3), comm)

    comm = hpccoll.Communicator()
    if comm.rank == 1:
        time.sleep({sleep})  # never enters the collective (alive, not finished: the job must still end)
    else:
        waiting_for_the_others(comm)
    print("rank", comm.rank, "past the collective", flush=True)
"""


@serial_only
def test_watchdog_dumps_every_threads_stack_with_the_rank_before_it_aborts():
    """HPCCOLL_TIMEOUT=2, rank 1 never arrives: rank 0 prints its tagged stacks, naming where it waits, and the job ends."""
    status, seconds, output = launch(NEVER_ARRIVES.format(sleep=3 * LIMIT), env={"HPCCOLL_TIMEOUT": "2"})
    assert status == TIMEOUT_EXIT_CODE and seconds < LIMIT, (status, seconds, output)
    assert "past the collective" not in output, output
    tagged = [line for line in output.splitlines() if line.startswith("[rank 0/2] ")]
    assert any("did not complete within HPCCOLL_TIMEOUT=2 s" in line for line in tagged), output
    stack = [line for line in tagged if line[len("[rank 0/2] ") :].strip().startswith("File ")]
    # the main thread's stack, down to the script's function, and the watchdog thread's own
    assert any(line.endswith(" in waiting_for_the_others") for line in stack), output
    assert any("in all_reduce" in line for line in stack), output
    assert any(line.endswith(" in _patrol") for line in stack), output
    assert any("MainThread" in line and "hpccoll-watchdog" in line for line in tagged), output
    assert not any(line.startswith("[rank 1/2] ") for line in output.splitlines()), output  # rank 1 was not stuck
    print(f"watchdog dump: exit status {status} after {seconds:.1f} s, {len(tagged)} lines tagged [rank 0/2]")


def test_stack_dump_tags_every_line():
    """The dump in-process: one header, every line with the tag, this very function among the frames."""
    from hpccoll._faults import stack_dump

    lines = stack_dump("a header", tag="3/8").decode().splitlines()
    assert lines[0] == "[rank 3/8] a header" and all(line.startswith("[rank 3/8] ") for line in lines), lines
    assert any(line.endswith(" in test_stack_dump_tags_every_line") for line in lines), lines


@pytest.mark.mpi
@pytest.mark.parametrize("raw,want", [("", None), ("0", None), ("2.5", 2.5), (" 30 ", 30.0)])
def test_timeout_setting(monkeypatch, raw, want):
    monkeypatch.setenv("HPCCOLL_TIMEOUT", raw)
    assert _settings.get("HPCCOLL_TIMEOUT") == want
    with hpccoll.Communicator() as c:
        assert c.timeout == want
        sub = c.split(0)
        assert sub.timeout == want
        sub.free()


@pytest.mark.mpi
@pytest.mark.parametrize("raw", ["soon", "-1", "inf", "nan"])
def test_bad_timeout_is_refused_before_any_communication(monkeypatch, raw):
    monkeypatch.setenv("HPCCOLL_TIMEOUT", raw)
    with pytest.raises(ArgumentError, match="HPCCOLL_TIMEOUT: expected a number of seconds"):
        hpccoll.Communicator()


@pytest.fixture(scope="module")
def watched():
    """Communicators under the watchdog (a generous limit), plain and in check mode."""
    saved = os.environ.get("HPCCOLL_TIMEOUT")
    os.environ["HPCCOLL_TIMEOUT"] = "120"
    try:
        pair = hpccoll.Communicator(), hpccoll.Communicator(check=True)
    finally:
        os.environ.pop("HPCCOLL_TIMEOUT") if saved is None else os.environ.__setitem__("HPCCOLL_TIMEOUT", saved)
    yield pair
    for c in pair:
        c.free()


@pytest.mark.mpi
@pytest.mark.parametrize("checked", [False, True], ids=["plain", "check"])
def test_watched_collectives_give_the_same_results(comm, watched, checked, monkeypatch):
    """Under the watchdog every primitive, and the check's exchange, returns what it does without."""
    from hpccoll.transports.host_mpi import HostMPI

    w = watched[checked]
    assert w.timeout == 120
    rng = np.random.default_rng(comm.rank)
    x, wide = rng.standard_normal((3, comm.rank + 1)), rng.standard_normal((2 * comm.size + 1, 4))
    calls = [
        lambda c: hpccoll.all_gather(x, c, axis=1),
        lambda c: hpccoll.all_gather(x.T, c, sizes=[r + 1 for r in range(c.size)]),
        lambda c: hpccoll.reduce_scatter(wide, c, axis=0),
        lambda c: hpccoll.reduce_scatter(wide[:, :2], c, axis=1, sizes=[2] + [0] * (c.size - 1)),
        lambda c: hpccoll.all_reduce(wide, c, op="max"),
        lambda c: hpccoll.all_reduce(wide.copy(), c, out=None),
    ]
    results = [(call(w), call(comm)) for call in calls]
    in_place = wide.copy()
    results.append((hpccoll.all_reduce(in_place, w, out=in_place), hpccoll.all_reduce(wide, comm)))
    monkeypatch.setattr(HostMPI, "strided_min_bytes", 0)  # the derived-datatype gathers, watched too
    monkeypatch.setattr(HostMPI, "strided_min_piece", 0)
    results.append((calls[0](w), calls[0](comm)))
    # broadcasts: a small one (host MPI's Bcast) and one past OVERLAP_BYTES (its Ibcast waited on), out of place
    last = comm.size - 1
    big = np.full(Selector.OVERLAP_BYTES // 8 + 3, float(comm.rank))
    for a in (wide, big):
        results.append((hpccoll.broadcast(a, w, root=last), hpccoll.broadcast(a, comm, root=last)))
    # NumPy on the global data: every rank's x and wide, drawn again from that rank's seed.
    drawn = [np.random.default_rng(r) for r in range(comm.size)]
    xs, wides = zip(*[(g.standard_normal((3, r + 1)), g.standard_normal(wide.shape)) for r, g in enumerate(drawn)])
    total = np.sum(wides, axis=0)
    rows = hpccoll.split_sizes(wide.shape[0], comm.size)
    lo = sum(rows[: comm.rank])
    want = [
        np.concatenate(xs, axis=1),
        np.concatenate([a.T for a in xs]),
        total[lo : lo + rows[comm.rank]],
        total[:, : 2 if comm.rank == 0 else 0],
        np.maximum.reduce(wides),
        total,
        total,
        np.concatenate(xs, axis=1),
        wides[last],
        np.full(big.shape, float(last)),
    ]
    same = [np.array_equal(a, b) for a, b in results]  # the watchdog changes nothing, bit for bit
    right = [a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-12) for (a, _), b in zip(results, want)]
    assert all_ranks(comm, all(same) and all(right)), (same, right)


@pytest.mark.mpi(min_size=2)
def test_watched_check_mode_still_shares_errors(watched):
    """The check's pickled exchange, watched, still raises the same error on every rank."""
    w = watched[True]
    odd = w.rank == w.size - 1
    raises_everywhere(
        w, hpccoll.MismatchError, "dtype", lambda: hpccoll.all_reduce(np.ones(2, "f4" if odd else "f8"), w)
    )
    raises_everywhere(w, ArgumentError, "raised on rank", lambda: hpccoll.all_gather(np.ones(2), w, axis=2 * odd))
