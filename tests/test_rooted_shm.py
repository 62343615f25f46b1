"""The ``shm`` transport's rooted primitives: bcast, reduce, gatherv, scatterv and their non-blocking forms.

Called on ``comm.transport_instance("shm")`` with flat wire buffers, at any rank
count (1-4), every root, against NumPy references from the global data:

- ``named``: ``transport="shm"`` (shm moves every blocking message it can itself);
- ``chunked``: the same with 256-byte scratch slots (every message in rounds);
- ``auto``: shm as ``auto`` offers it, so the sizes in ``SharedMemory.wins``
  go through shared memory and the others to the host transport (checked on
  both sides of each rooted range).

The multi-node case (simulated nodes, ``HPCCOLL_NODE_SIZE``) is launched from
the serial run over this file.
"""

import sys

import numpy as np
import pytest
from conftest import assert_close, assert_same, make, reference
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll
from hpccoll.transports.shm import SharedMemory

pytestmark = pytest.mark.mpi

serial_only = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")
ROOTED = ("bcast", "reduce")  # the rooted primitives shm may move itself (``wins``)
MOVE_DTYPES = [np.float64, np.float32, np.int32, np.uint8, np.complex128, np.bool_]
MOVE_IDS = ["f8", "f4", "i4", "u1", "c16", "b1"]
SIZES = [0, 1, 7, 1000, 40_000]


@pytest.fixture(scope="module")
def named():
    c = hpccoll.Communicator(transport="shm")
    yield c
    c.free()


@pytest.fixture(scope="module")
def chunked():
    c = hpccoll.Communicator(transport="shm")
    c.transport_instance("shm").chunk_bytes = 256
    yield c
    c.free()


@pytest.fixture(scope="module")
def auto():
    with pytest.MonkeyPatch.context() as m:
        m.delenv("HPCCOLL_TRANSPORT", raising=False)  # auto's own choices, whatever the run named
        c = hpccoll.Communicator(transport="auto")
    yield c
    c.free()


@pytest.fixture(params=["named", "chunked"])
def comm_shm(request):
    return request.getfixturevalue(request.param)


def stack_of(P, n, dtype, seed):
    return np.stack([make((n,), dtype, seed=seed + q) for q in range(P)]) if P else None


def uneven(P, seed):
    """Per-rank counts with zeros among them (rank-count independent pattern)."""
    return [(3 * q + seed) % 5 for q in range(P)]


def finish(pending, blocking):
    if not blocking:
        pending.wait()


# --------------------------------------------------------------------------- host composition


def test_host_is_the_communicators_host_transport(named):
    t = named.transport_instance("shm")
    assert t.everything and t.host is named.host_transport()
    assert type(t.host).hosts


def test_shared_results_is_a_declared_capability(named):
    from hpccoll.transports._base import Transport

    t = named.transport_instance("shm")
    assert SharedMemory.shared_results and not Transport.shared_results and not type(t.host).shared_results
    one_node = not t.node.multi or (t.node.contiguous)
    assert t.gathers_shared((4, 3), 0) == one_node
    assert t.gathers_shared((2, 4), 1) == (not t.node.multi)


# --------------------------------------------------------------------------- bcast


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=MOVE_IDS)
def test_bcast_every_root(comm_shm, dtype, n, blocking):
    c, t = comm_shm, comm_shm.transport_instance("shm")
    full = stack_of(c.size, n, dtype, seed=n)
    for root in range(c.size):
        buf = full[c.rank].copy()
        finish(t.bcast(buf, root) if blocking else t.ibcast(buf, root), blocking)
        assert_same(buf, full[root])


def test_bcast_from_a_shared_segment(named):
    """Root's buffer in node-shared memory: the others read it where it is, and root may write it again."""
    c, t = named, named.transport_instance("shm")
    n = 5000
    for root in range(c.size):
        buf = c.shared_empty(n, np.float64)
        buf[...] = np.arange(n) + 10.0 * c.rank
        t.bcast(buf, root)
        assert_same(buf, np.arange(n) + 10.0 * root)
        buf[...] = -1.0  # root's write after the call must not reach anyone's result
        del buf


# --------------------------------------------------------------------------- reduce

REDUCE_CASES = [
    (np.float64, "sum"),
    (np.float64, "prod"),
    (np.float64, "max"),
    (np.float64, "min"),
    (np.float32, "sum"),
    (np.complex128, "sum"),
    (np.int32, "sum"),
    (np.int64, "max"),
    (np.int32, "land"),
    (np.int32, "lor"),
    (np.int32, "lxor"),
    (np.int64, "band"),
    (np.int64, "bor"),
    (np.int64, "bxor"),
    (np.uint8, "min"),
]


def check_reduced(got, stack, op, rank, root, host=False):
    if rank != root:
        return
    want = reference(stack, op)
    if host and len(stack) == 1 and op in ("land", "lor", "lxor"):
        want = stack[0]  # MPI reduces nothing on one rank: a copy, not truth values (the collectives see to those)
    if stack.dtype.kind in "iub":
        assert_same(got, want)
    else:
        assert_close(got, want)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype,op", REDUCE_CASES, ids=[f"{np.dtype(d).name}-{o}" for d, o in REDUCE_CASES])
def test_reduce_every_root(comm_shm, dtype, op, n, in_place, blocking):
    c, t = comm_shm, comm_shm.transport_instance("shm")
    stack = stack_of(c.size, n, dtype, seed=3 * n + 1)
    for root in range(c.size):
        recv = stack[c.rank].copy() if in_place else np.full(n, 99, dtype)
        send = None if in_place else stack[c.rank].copy()
        finish(t.reduce(send, recv, op, root) if blocking else t.ireduce(send, recv, op, root), blocking)
        check_reduced(recv, stack, op, c.rank, root, host=not blocking)
        if send is not None:
            assert_same(send, stack[c.rank])  # the input is left alone


def test_reduce_from_shared_segments(named):
    """Every rank's input in node-shared memory: root reads them in place; their owners may write them again."""
    c, t = named, named.transport_instance("shm")
    n = 3000
    stack = stack_of(c.size, n, np.float64, seed=7)
    for root in range(c.size):
        send = c.shared_empty(n, np.float64)
        send[...] = stack[c.rank]
        recv = np.empty(n)
        t.reduce(send, recv, "sum", root)
        send[...] = np.nan  # an owner's write after the call must not reach root's result
        check_reduced(recv, stack, "sum", c.rank, root)
        del send


# --------------------------------------------------------------------------- gatherv / scatterv


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.uint8], ids=["f8", "i2", "u1"])
def test_gatherv_uneven_every_root(comm_shm, dtype, seed, blocking):
    c, t = comm_shm, comm_shm.transport_instance("shm")
    counts = uneven(c.size, seed)
    blocks = [make((k,), dtype, seed=10 * seed + q) for q, k in enumerate(counts)]
    for root in range(c.size):
        recv = np.full(sum(counts), 7, dtype) if c.rank == root else None
        send = blocks[c.rank].copy()
        finish(t.gatherv(send, recv, counts, root) if blocking else t.igatherv(send, recv, counts, root), blocking)
        if c.rank == root:
            assert_same(recv, np.concatenate(blocks))


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.uint8], ids=["f8", "i2", "u1"])
def test_scatterv_uneven_every_root(comm_shm, dtype, seed, blocking):
    c, t = comm_shm, comm_shm.transport_instance("shm")
    counts = uneven(c.size, seed)
    full = make((sum(counts),), dtype, seed=seed + 5)
    start = sum(counts[: c.rank])
    for root in range(c.size):
        send = full.copy() if c.rank == root else None
        recv = np.full(counts[c.rank], 7, dtype)
        finish(t.scatterv(send, recv, counts, root) if blocking else t.iscatterv(send, recv, counts, root), blocking)
        assert_same(recv, full[start : start + counts[c.rank]])


# --------------------------------------------------------------------------- auto: both sides of wins


@pytest.mark.parametrize("primitive", ROOTED)
def test_auto_moves_the_rooted_wins_and_hands_the_rest_to_host(auto, primitive, monkeypatch):
    """Under ``auto``, sizes in ``wins`` go through shared memory (one node), the others to the host transport
    (``wins`` taken as the verdict: ``first_use`` off, its races are tests/test_shm.py's)."""
    t = auto.transport_instance("shm")
    assert not t.everything
    monkeypatch.setattr(t, "first_use", False)
    auto.selector.clear()
    span = SharedMemory.wins.get(primitive)
    moved = []
    host_calls = []
    original = getattr(type(t.host), primitive)

    def recording(self, *args):
        host_calls.append(primitive)
        return original(self, *args)

    monkeypatch.setattr(type(t.host), primitive, recording)
    sizes = [1024] if span is None else sorted({max(8, span[0] - 8), span[0], min(span[1], 1 << 24) - 8})
    for nbytes in sizes:
        n = nbytes // 8
        stack = stack_of(auto.size, n, np.float64, seed=nbytes % 97)
        for root in range(auto.size):
            host_calls.clear()
            mover = auto.transport_of("numpy", nbytes, primitive)
            if primitive == "bcast":
                buf = stack[auto.rank].copy()
                mover.bcast(buf, root)
                assert_same(buf, stack[root])
            else:
                recv = np.empty(n)
                mover.reduce(stack[auto.rank].copy(), recv, "sum", root)
                check_reduced(recv, stack, "sum", auto.rank, root)
            native = span is not None and span[0] <= nbytes < span[1] and not t.node.multi
            assert (mover is t) == native
            assert host_calls == ([] if native else [primitive]), (nbytes, host_calls)
            moved.append(native)
    if span is not None and span[0] > 8 and not t.node.multi:
        assert True in moved and False in moved  # both sides of the range were exercised


# --------------------------------------------------------------------------- simulated nodes

#: ranks, HPCCOLL_NODE_SIZE: the nodes it makes.
SIMULATED_NODES = {
    "4-ranks-2-nodes-of-2": (4, "2"),  # {0, 1} {2, 3}
    "3-ranks-nodes-of-2-and-1-cyclic": (3, "2,cyclic"),  # {0, 2} {1}: uneven, not rank order
}


@serial_only
@pytest.mark.timeout(660)
@pytest.mark.parametrize("case", sorted(SIMULATED_NODES))
def test_rooted_on_simulated_nodes(case):
    """Across (simulated) nodes the rooted primitives go to the host transport, with the same results."""
    n, layout = SIMULATED_NODES[case]
    proc = run_mpiexec(
        n,
        [sys.executable, "-m", "mpi4py", "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-x", __file__],
        env={"HPCCOLL_NODE_SIZE": layout},
        drop=("HPCCOLL_",),
        timeout=600,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert " passed" in output and " failed" not in output, output[-2000:]
