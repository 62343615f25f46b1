"""Messages of the wrong size without check mode: the rank that sees one raises ``MismatchError``.

A receive of a message longer than its buffer (MPI's truncation error) or
shorter (MPI accepts it, and says so in the receive's status) becomes a
``MismatchError`` naming the collective, what this rank expected and what
arrived, on the rank that received it. Ranks whose own messages had the
right size return the right answer. Each rank's outcome is gathered and
judged together, so a failure fails every rank at once.

Mismatches MPI's collectives handle their own way (MPICH aborts the job on a
truncated ``MPI_Allreduce``; a jitted JAX call raises inside XLA) run as
``mpiexec -n 2`` jobs of their own from the serial run, under
``HPCCOLL_TIMEOUT``.
"""

import re

import numpy as np
import pytest
from mpi4py import MPI
from test_faults import LIMIT, launch, serial_only

import hpccoll


def _seq(n, rank, dtype=np.float64):
    return (np.arange(n) + 10 * rank).astype(dtype)


def _outcomes(comm, call):
    """Every rank's ``("returned", result)`` or ``("raised", type name, message)`` of ``call()`` (collective)."""
    try:
        seen = ("returned", call())
    except Exception as e:  # noqa: BLE001 - judged on every rank below
        seen = ("raised", type(e).__name__, str(e))
    return comm.mpi.allgather(seen)


def _shift_case(c, async_op=False):
    """The last rank shifts 5 elements, the others 4: the call, and every rank's number of elements."""
    n = [5 if r == c.size - 1 else 4 for r in range(c.size)]
    x = _seq(n[c.rank], c.rank)
    if async_op:
        return lambda: hpccoll.shift(x, c, async_op=True).wait(), n
    return lambda: hpccoll.shift(x, c), n


def _judge_shift(c, everyone, n, what="shift"):
    """Rank r gets rank r-1's message: a wrong size there raises MismatchError saying so; the rest are right."""
    problems = []
    for r, seen in enumerate(everyone):
        source = (r - 1) % c.size
        if n[source] == n[r]:
            if seen[0] != "returned" or not np.array_equal(seen[1], _seq(n[r], source)):
                problems.append(f"rank {r}: expected the right answer; got {seen[:2]}")
            continue
        pattern = rf"^{what}\b.*expected {8 * n[r]} bytes \({n[r]} x float64\) from rank {source}.*HPCCOLL_CHECK=1"
        if seen[0] != "raised" or seen[1] != "MismatchError" or not re.search(pattern, seen[2]):
            problems.append(f"rank {r}: expected MismatchError matching {pattern!r}; got {seen}")
        elif n[source] < n[r] and f"{8 * n[source]} bytes arrived" not in seen[2]:
            problems.append(f"rank {r}: the message does not say what arrived: {seen[2]}")
        elif n[source] > n[r] and "longer message arrived" not in seen[2]:
            problems.append(f"rank {r}: the message does not say a longer message arrived: {seen[2]}")
    assert not problems, problems


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("form", ["blocking", "async"])
def test_shift_of_another_size_raises_where_it_arrives(comm, form):
    """A Request's ``wait()`` runs outside the public call: its message names the MPI call instead."""
    call, n = _shift_case(comm, async_op=form == "async")
    everyone = _outcomes(comm, call)
    _judge_shift(comm, everyone, n, "shift" if form == "blocking" else "MPI_Irecv")
    assert comm.mpi.allreduce(1) == comm.size  # still usable


@pytest.mark.mpi(min_size=2)
def test_shift_of_the_same_size_is_check_modes_job(comm):
    """(3, 2) against (2, 3): one size, so no error without check mode; every rank gets its source's elements."""
    shape = (3, 2) if comm.rank == comm.size - 1 else (2, 3)
    everyone = _outcomes(comm, lambda: hpccoll.shift(_seq(6, comm.rank).reshape(shape), comm))
    ok = [
        s[0] == "returned" and np.array_equal(s[1].ravel(), _seq(6, (r - 1) % comm.size))
        for r, s in enumerate(everyone)
    ]
    assert all(ok), everyone


@pytest.mark.mpi(min_size=2)
def test_halo_exchange_of_another_size_raises_on_every_rank(comm):
    """A 1-D periodic ring, the last rank's block one cell wider along the other axis: its faces are longer.
    The exchange's own agreement (every rank's shape and dtype, every pair of neighbours checked alike) sees
    it before any message moves, so every rank raises, and no receive needs its status read."""
    grid = comm.cartesian([comm.size], periodic=True)
    width = 3 if comm.rank == comm.size - 1 else 2
    x = np.zeros((4, width)) + comm.rank
    everyone = _outcomes(grid, lambda: hpccoll.halo_exchange(x, grid, halo=1))
    grid.free()
    for seen in everyone:
        assert seen[:2] == ("raised", "MismatchError") and seen[2].startswith("halo_exchange"), everyone


@pytest.mark.mpi(min_size=2)
def test_all_to_all_pairs_of_another_size_raise_where_they_arrive(comm):
    """The last rank's recv_sizes claim 3 elements from rank 0, which sends it 2 (uneven: point-to-point pairs)."""
    odd = comm.size - 1
    recv = [2 + (r == 0 and comm.rank == odd) for r in range(comm.size)]
    everyone = _outcomes(comm, lambda: hpccoll.all_to_all(_seq(2 * comm.size, comm.rank), comm, recv_sizes=recv))
    for r, seen in enumerate(everyone):
        if r == odd:
            assert seen[:2] == ("raised", "MismatchError"), everyone
            assert re.search(
                r"^all_to_all \(.*expected 24 bytes \(3 x float64\) from rank 0; 16 bytes arrived", seen[2]
            )
        else:
            want = np.concatenate([_seq(2 * comm.size, q)[2 * r : 2 * r + 2] for q in range(comm.size)])
            assert seen[0] == "returned" and np.array_equal(seen[1], want), everyone


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("longer", [True, False])
def test_two_rank_broadcast_of_another_size_raises_on_the_receiver(comm, longer):
    """Between two ranks a broadcast is one message: the receiver sees its size (root returns its own data)."""
    if comm.size != 2:
        pytest.skip("two ranks: one message (more: MPI_Bcast, whose algorithm decides who sees what)")
    n = 4 + (comm.rank == 1) * (1 if not longer else -1)
    everyone = _outcomes(comm, lambda: hpccoll.broadcast(_seq(n, comm.rank), comm))
    assert everyone[0][0] == "returned" and np.array_equal(everyone[0][1], _seq(4, 0)), everyone
    assert everyone[1][:2] == ("raised", "MismatchError"), everyone
    arrived = "a longer message arrived" if longer else "32 bytes arrived"
    assert everyone[1][2].startswith("broadcast (") and arrived in everyone[1][2], everyone


@pytest.mark.mpi(min_size=2)
def test_right_sizes_still_pass_every_checked_path(comm):
    """The paths that now read statuses give NumPy's answers when every size agrees."""
    P, me = comm.size, comm.rank
    x = _seq(4, me)
    got = [
        hpccoll.shift(x, comm),
        hpccoll.shift(x, comm, async_op=True).wait(),
        hpccoll.plan(hpccoll.shift, x, comm, out=np.empty(4))(),
        hpccoll.all_to_all(_seq(2 * P, me), comm, recv_sizes=[2] * P, sizes=[2] * P),
        hpccoll.all_to_all(_seq(3 * P - 1, me), comm, sizes=[3] * (P - 1) + [2]),
        hpccoll.broadcast(x, comm, root=P - 1),
        hpccoll.plan(hpccoll.broadcast, x, comm, out=np.empty(4), root=P - 1, method="persistent")(),
        hpccoll.plan(hpccoll.broadcast, x, comm, out=np.empty(4), root=P - 1, method="blocking")(),
    ]
    want = [
        _seq(4, (me - 1) % P),
        _seq(4, (me - 1) % P),
        _seq(4, (me - 1) % P),
        np.concatenate([_seq(2 * P, q)[2 * me : 2 * me + 2] for q in range(P)]),
        np.concatenate([_seq(3 * P - 1, q)[3 * me : 3 * me + (3 if me < P - 1 else 2)] for q in range(P)]),
        _seq(4, P - 1),
        _seq(4, P - 1),
        _seq(4, P - 1),
    ]
    ok = all(np.array_equal(g, w) for g, w in zip(got, want))
    assert comm.mpi.allreduce(ok, op=MPI.LAND)


# --------------------------------------------------------------------------- jobs of their own

JOB = """
    import numpy as np
    import hpccoll
    c = hpccoll.Communicator()
    odd = c.rank == c.size - 1
    {setup}
    try:
        r = {call}
        line = f"rank {{c.rank}} returned {{np.asarray(r).tolist()}}"
    except Exception as e:
        line = f"rank {{c.rank}} raised {{type(e).__module__}}.{{type(e).__name__}}: {{e}}"
    print(line, flush=True)
"""

JAX_SETUP = """
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import hpccoll.adapters.jax as hcj
    x = jnp.arange(4, dtype=jnp.float32 if odd else jnp.float64)
    def shifted(x):
        with hcj.reraise():
            return jax.jit(lambda v: hcj.shift(v, c) * 1)(x).block_until_ready()
"""


@serial_only
def test_jitted_jax_shift_of_another_dtype_raises_mismatch_error():
    pytest.importorskip("jax")
    status, seconds, output = launch(JOB.format(setup=JAX_SETUP, call="shifted(x)"), env={"HPCCOLL_TIMEOUT": "5"})
    raised = re.findall(r"rank (\d) raised hpccoll\.MismatchError: shift \(", output)
    assert status == 0 and sorted(raised) == ["0", "1"] and seconds < LIMIT, (status, seconds, output)


@serial_only
def test_all_reduce_of_another_dtype_never_hangs_under_the_watchdog():
    """float32 on one rank, float64 on the other: MPI's collective decides (MPICH aborts the job, or one rank
    waits for a message that never comes, which the watchdog ends); a rank that raises raises MismatchError."""
    call = "hpccoll.all_reduce(np.ones(4, np.float32 if odd else np.float64), c)"
    status, seconds, output = launch(JOB.format(setup="", call=call), env={"HPCCOLL_TIMEOUT": "3"})
    assert seconds < LIMIT, (status, seconds, output)
    for line in re.findall(r"rank \d raised .*", output):
        assert "hpccoll.MismatchError: all_reduce (" in line, output
    print(f"all_reduce float32/float64: status {status} after {seconds:.1f} s")
