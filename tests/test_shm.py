"""The ``shm`` transport: node-shared memory collectives, shared inputs and results, lifetimes, faults.

Runs at any rank count (1-4 in ``make test``); every result is compared with a
NumPy reference computed from the global data. The multi-node logic is tested
by launching jobs with simulated nodes (``HPCCOLL_NODE_SIZE``, leaders over real
MPI) from the serial run, over this file and the ``mpi`` transport's own test
files: 4 ranks as two nodes of 2 (in blocks and dealt cyclically), 3 ranks as
uneven nodes of 2 and 1, and 3 ranks as single-rank nodes.
"""

import hashlib
import pathlib
import sys
import textwrap

import numpy as np
import pytest
from conftest import (
    DTYPE_IDS,
    DTYPES,
    SIZE_PATTERNS,
    agree,
    all_ranks,
    assert_close,
    assert_same,
    make,
    raises_everywhere,
    reference,
)
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll
from hpccoll.transports import Selector
from hpccoll.transports.shm import SharedMemory

pytestmark = pytest.mark.mpi

OPS = ["sum", "prod", "max", "min", "avg"]
TESTS = pathlib.Path(__file__).resolve().parent
serial_only = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")


@pytest.fixture(scope="module")
def shm():
    c = hpccoll.Communicator(transport="shm")
    yield c
    c.free()


@pytest.fixture
def chunked():
    """A communicator whose shm scratch holds 256 bytes per rank and round: every message travels in rounds."""
    c = hpccoll.Communicator(transport="shm")
    t = c.transport_instance("shm")
    t.chunk_bytes = 256
    t.direct_bytes = 0  # all-reduce by reduce-scatter + read-all, whatever the size
    yield c
    c.free()


def unsupported(dtype, op):
    return (op == "avg" and dtype.kind in "biu") or (dtype.kind == "c" and op in ("max", "min"))


def digest(a):
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()


def same_everywhere(comm, a):
    """Whether ``a`` has the same bytes on every rank."""
    return len(set(comm.mpi.allgather(digest(a)))) == 1


def block(full, sizes, rank):
    lo = sum(sizes[:rank])
    return full[lo : lo + sizes[rank]]


# --------------------------------------------------------------------------- selection


def test_selected_for_numpy_when_forced(shm, monkeypatch):
    assert shm.transport_for(np.zeros(3)).name == "shm"
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "shm")
    with hpccoll.Communicator() as c:
        assert c.transport == "shm" and c.transport_for(np.zeros(3)).name == "shm"
        assert c.transport_of("numpy", 8).everything  # named: shm moves every blocking message itself


def test_auto_offers_shm_the_large_messages_on_one_node(monkeypatch):
    """Under ``auto`` (``wins`` taken as the verdict: ``first_use`` off) shm gets the sizes in ``wins``."""
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    monkeypatch.delenv("HPCCOLL_NODE_SIZE", raising=False)
    monkeypatch.setattr(SharedMemory, "first_use", False)
    with hpccoll.Communicator() as c:
        choice = c.transport_for(np.zeros(3))
        assert choice.name == "mpi" and "node-shared memory" in choice.reason, choice
        big = c.transport_of("numpy", SharedMemory.min_bytes)
        assert c.transport_of("numpy", SharedMemory.min_bytes - 1).name == "mpi"
        assert big.name == "shm" and not big.everything
        assert all(
            c.transport_of("numpy", low, p) is big and c.transport_of("numpy", low - 1, p).name == "mpi"
            for p, (low, _) in SharedMemory.wins.items()
        )
        assert c.transport_of("numpy", 1 << 20, "allgatherv").name == "mpi"  # measured slower: not without a profile
        assert c.transport_of("numpy", 1 << 20, "allreduce", blocking=False).name == "mpi"  # non-blocking: MPI's
        x = np.arange(SharedMemory.min_bytes // 8, dtype=np.float64) + c.rank
        np.testing.assert_array_equal(hpccoll.all_reduce(x, c), np.arange(x.size) * c.size + sum(range(c.size)))


def test_auto_races_shm_against_host_on_first_use(monkeypatch):
    """Without a profile, the first message of a primitive in ``wins``' ranges, per power-of-two size class,
    times shm against host MPI on scratch buffers (collective; the slowest rank's times, so every rank
    agrees), and the winner moves that class from then on; sizes outside ``wins`` and past
    ``race_max_bytes`` race nothing more; results are NumPy's whichever transport won."""
    from hpccoll import transports

    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    monkeypatch.delenv("HPCCOLL_NODE_SIZE", raising=False)
    real, raced = transports.race, []

    def recorded(c, fns, nbytes, *args, **kwargs):
        times = real(c, fns, nbytes, *args, **kwargs)
        raced.append((nbytes, sorted(fns)))
        # shm "wins" below 4 MiB; from there on it is faster, but within race_margin: host MPI keeps those
        times["ratio"] = 0.5 if nbytes < 4 << 20 else (1 + SharedMemory.race_margin) / 2
        return times

    monkeypatch.setattr(transports, "race", recorded)
    monkeypatch.setattr(SharedMemory, "race_max_bytes", 8 << 20)
    with hpccoll.Communicator() as c:
        t = c.transport_of("numpy", SharedMemory.min_bytes)
        if c.size == 1 or t.name != "shm":
            return  # one rank: auto's chain ends at MPI's; several nodes: shm is not auto's
        low = SharedMemory.wins["allreduce"][0]

        def mine(nbytes, primitive="allreduce"):
            return c.transport_of("numpy", nbytes, primitive) is t

        # each ask may race (collective): every verdict is agreed before the next, failing on every rank at once
        agree(c, mine(low) and raced == [(low, ["mpi", "shm"])], str(raced))
        agree(c, mine(low + 8) and len(raced) == 1, str(raced))  # the same size class: no second race
        agree(c, not mine(4 << 20) and raced[-1][0] == 4 << 20, str(raced))  # a new class, lost
        agree(c, not mine(64 << 20) and raced[-1][0] == 8 << 20, str(raced))  # past race_max_bytes: raced there
        agree(c, not mine(32 << 20) and len(raced) == 3, str(raced))  # ... once
        agree(c, not mine(low - 8) and not mine(1 << 20, "allgatherv") and len(raced) == 3, str(raced))
        for nbytes in (low, 4 << 20):  # both verdicts, through the public call
            x = np.arange(nbytes // 8, dtype=np.float64) + c.rank
            want = np.arange(x.size) * c.size + sum(range(c.size))
            np.testing.assert_array_equal(hpccoll.all_reduce(x, c), want)
            np.testing.assert_array_equal(x, np.arange(x.size) + c.rank)  # the input untouched


def test_races_time_the_collective_not_the_bare_primitive():
    """A transport race (shm's first use, ``tune``) runs what the public collective runs: a reduce's ranks
    other than root also fill their result with zeros (on Open MPI that fill alone turned a race from shm
    to host MPI); every other call is raced as it is."""
    from types import SimpleNamespace

    from hpccoll.transports._tuned import as_collective, buffers

    args = buffers("reduce", 64, SimpleNamespace(size=2))
    calls = []

    def call():
        calls.append(1)

    assert as_collective(call, "reduce", args, rank=args[3]) is call  # root keeps its result
    assert as_collective(call, "allreduce", buffers("allreduce", 64, SimpleNamespace(size=2)), rank=1) is call
    other = as_collective(call, "reduce", args, rank=1)
    args[1][...] = 5
    other()
    assert calls == [1] and not args[1].any()


def test_auto_leaves_several_nodes_to_mpi(monkeypatch):
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "1")
    with hpccoll.Communicator() as c:
        assert c.transport_of("numpy", 1 << 30).name == ("shm" if c.size == 1 else "mpi")
        if c.size > 1:
            assert f"spans {c.size} nodes" in SharedMemory.auto_reason(c)


@pytest.mark.parametrize("dtype", [np.float64, np.int32], ids=["f8", "i4"])
def test_auto_large_messages_go_through_shm(dtype, monkeypatch):
    """Under auto (``first_use`` off) the sizes in ``wins`` go through shm (in place too), with NumPy's results."""
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    monkeypatch.delenv("HPCCOLL_NODE_SIZE", raising=False)
    monkeypatch.setattr(SharedMemory, "first_use", False)
    handed, moved = Selector._handed, set()

    def recording(self, t, primitive, nbytes, blocking):
        took = handed(self, t, primitive, nbytes, blocking)
        if took.name == "shm":
            moved.add(primitive)
        return took

    monkeypatch.setattr(Selector, "_handed", recording)
    with hpccoll.Communicator() as c:
        P, r, n = c.size, c.rank, (1 << 20) // np.dtype(dtype).itemsize  # 1 MiB per rank
        pieces = np.stack([make((n,), dtype, seed=q) for q in range(P)])  # rank q's input to all_gather
        stack = np.stack([make((n * P,), dtype, seed=10 + q) for q in range(P)])  # and to the reductions
        x, full = pieces[r], stack[r]
        gathered = hpccoll.all_gather(x, c)
        own = np.empty(n * P, dtype)
        own[r * n : (r + 1) * n] = x
        hpccoll.all_gather(own[r * n : (r + 1) * n], c, out=own)  # in place
        rs = hpccoll.reduce_scatter(full, c)
        ar = hpccoll.all_reduce(full, c)
        y = full.copy()
        hpccoll.all_reduce(y, c, out=y)
        same = same_everywhere(c, ar)
    want_ar = reference(stack, "sum")
    assert_same(gathered, pieces.reshape(-1))
    assert_same(own, pieces.reshape(-1))
    assert_close(rs, want_ar[r * n : (r + 1) * n])
    assert_close(ar, want_ar)
    assert_close(y, want_ar)
    assert same
    if P > 1:  # shm moved the reduce-scatters and all-reduces (no profile: the all-gathers went to MPI)
        assert moved == {"allreduce", "reduce_scatter"}, moved


def test_usable_and_wins_declared(shm):
    assert SharedMemory.unavailable_reason(shm) is None
    assert SharedMemory.array_kind == "numpy" and SharedMemory.in_place
    assert set(SharedMemory.wins) == {"reduce_scatter", "allreduce", "reduce"}  # bcast: host MPI at every size
    assert SharedMemory.min_bytes == min(low for low, _ in SharedMemory.wins.values())


def test_bad_node_size_is_refused_everywhere(monkeypatch):
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "two")
    with hpccoll.Communicator(transport="shm") as c:
        raises_everywhere(
            c, hpccoll.ArgumentError, "HPCCOLL_NODE_SIZE: expected a positive int", lambda: c.shared_empty(2)
        )  # read where shm first runs (a collective skips it at 1 rank)


# --------------------------------------------------------------------------- private inputs and outputs


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_bit_for_bit(shm, dtype, pattern, in_place):
    sizes = SIZE_PATTERNS[pattern](shm.size)
    full = make((sum(sizes), 3), dtype, seed=3)
    x = block(full, sizes, shm.rank).copy()
    if in_place:
        out = np.zeros_like(full)
        mine = block(out, sizes, shm.rank)
        mine[...] = x
        got = hpccoll.all_gather(mine, shm, sizes=sizes, out=out)
        assert got is out
    else:
        got = hpccoll.all_gather(x, shm)
    assert_same(got, full)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_scatter_every_dtype_op_and_pattern(shm, dtype, op, pattern, in_place):
    sizes = SIZE_PATTERNS[pattern](shm.size)
    stack = make((shm.size, sum(sizes), 2), dtype, seed=11, kind="exact")
    x = stack[shm.rank].copy()
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.reduce_scatter(x, shm, op=op, sizes=sizes)
        return
    want = block(reference(stack, op), sizes, shm.rank)
    if in_place:
        got = hpccoll.reduce_scatter(x, shm, op=op, sizes=sizes, out=block(x, sizes, shm.rank))
    else:
        before = x.copy()
        got = hpccoll.reduce_scatter(x, shm, op=op, sizes=sizes)
        assert_same(x, before)  # inputs are never modified
    assert_close(got, want)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_every_dtype_and_op_same_bits_everywhere(shm, dtype, op, in_place):
    stack = make((shm.size, 7, 3), dtype, seed=5)
    x = stack[shm.rank].copy()
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.all_reduce(x, shm, op=op)
        return
    got = hpccoll.all_reduce(x, shm, op=op, out=x if in_place else None)
    assert (got is x) == in_place
    assert_close(got, reference(stack, op))
    assert all_ranks(shm, same_everywhere(shm, got))


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64, np.bool_], ids=["f8", "i4", "c8", "bool"])
def test_rounds_and_both_all_reduce_schemes(chunked, dtype, op):
    """Messages many times the scratch slot travel in rounds; all-reduce by reduce-scatter + read-all."""
    dtype = np.dtype(dtype)
    if unsupported(dtype, op):
        return
    c = chunked
    sizes = [37 * (r + 1) if r != 1 else 0 for r in range(c.size)]
    stack = make((c.size, sum(sizes)), dtype, seed=2, kind="exact")
    x = stack[c.rank]
    assert_same(hpccoll.all_gather(block(stack[0], sizes, c.rank).copy(), c, sizes=sizes), stack[0])
    if dtype != np.bool_:
        assert_close(hpccoll.reduce_scatter(x, c, op=op, sizes=sizes), block(reference(stack, op), sizes, c.rank))
    got = hpccoll.all_reduce(x, c, op=op)
    assert_close(got, reference(stack, op))
    assert all_ranks(c, same_everywhere(c, got))
    y = x.copy()
    assert_close(hpccoll.all_reduce(y, c, op=op, out=y), reference(stack, op))


def test_lists_and_async(shm):
    xs = [np.full((2, 3), shm.rank, np.float32), np.arange(5) + shm.rank]
    got = hpccoll.all_reduce(xs, shm)
    total = sum(range(shm.size))
    np.testing.assert_array_equal(got[0], np.full((2, 3), total, np.float32))
    np.testing.assert_array_equal(got[1], np.arange(5) * shm.size + total)
    req = hpccoll.all_gather(np.full(2, shm.rank), shm, async_op=True)
    np.testing.assert_array_equal(req.wait(), np.repeat(np.arange(shm.size), 2))


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.complex64, np.bool_], ids=["f8", "i2", "c8", "bool"])
def test_all_to_all_and_its_adjoint(shm, dtype, pattern, async_op):
    """all_to_all on the shm communicator (its pairs go through host MPI) against a NumPy exchange."""
    p, me = shm.size, shm.rank
    sizes = SIZE_PATTERNS[pattern](p)  # what every rank sends to rank j along axis 0
    xs = [make((sum(sizes), 3), dtype, seed=40 + r) for r in range(p)]
    lo = [sum(sizes[:j]) for j in range(p)]
    want = np.concatenate([x[lo[me] : lo[me] + sizes[me]] for x in xs])
    got = hpccoll.all_to_all(xs[me], shm, sizes=sizes, recv_sizes=[sizes[me]] * p, async_op=async_op)
    assert_same(got.wait() if async_op else got, want, comm=shm)
    back = hpccoll.all_to_all_adjoint(want, shm, sizes=sizes, recv_sizes=[sizes[me]] * p)
    assert_same(back, xs[me], comm=shm)


# --------------------------------------------------------------------------- shared inputs


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.complex128, np.bool_], ids=["f8", "i2", "c16", "bool"])
def test_shared_inputs_are_read_in_place(shm, dtype):
    dtype = np.dtype(dtype)
    sizes = SIZE_PATTERNS["uneven"](shm.size)
    full = make((sum(sizes), 4), dtype, seed=9)
    s = shm.shared_empty((sizes[shm.rank], 4), dtype)
    assert type(s) is np.ndarray and s.flags.writeable and s.flags.c_contiguous and s.dtype == dtype
    s[...] = block(full, sizes, shm.rank)
    assert_same(hpccoll.all_gather(s, shm, sizes=sizes), full)
    assert s.flags.writeable  # a private result: the shard stays writeable
    stack = make((shm.size, sum(sizes), 4), dtype, seed=4, kind="exact")
    t = shm.shared_empty(stack.shape[1:], dtype)
    t[...] = stack[shm.rank]
    op = "max" if dtype == np.bool_ else "sum"
    assert_close(hpccoll.reduce_scatter(t, shm, op=op, sizes=sizes), block(reference(stack, op), sizes, shm.rank))
    assert_close(hpccoll.all_reduce(t, shm, op=op), reference(stack, op))
    assert_same(t, stack[shm.rank])  # never modified


def test_shared_empty_shapes_may_differ_and_are_aligned(shm):
    a = shm.shared_empty((shm.rank + 1, 3), np.float32)
    b = shm.shared_empty(shm.rank * 5, np.uint8)
    c = shm.shared_empty((), np.complex128)
    assert a.shape == (shm.rank + 1, 3) and b.shape == (shm.rank * 5,) and c.shape == ()
    for arr in (a, b, c):
        assert arr.__array_interface__["data"][0] % arr.itemsize == 0
    a[...] = 1
    b[...] = 2
    c[...] = 3j
    assert a.sum() == 3 * (shm.rank + 1) and b.sum() == 10 * shm.rank and c == 3j


def test_shared_empty_bad_input_raises_on_every_rank(shm):
    raises_everywhere(shm, hpccoll.ArgumentError, "shape: expected", lambda: shm.shared_empty((2, -1)))
    raises_everywhere(shm, hpccoll.DTypeError, "dtype: expected", lambda: shm.shared_empty(3, object))
    raises_everywhere(shm, hpccoll.ArgumentError, "dtype: expected a NumPy dtype", lambda: shm.shared_empty(3, "nope"))


def test_shared_empty_one_bad_rank_raises_on_every_rank(shm):
    bad = shm.size - 1
    shape = (-1,) if shm.rank == bad else (4,)
    if shm.size == 1:
        raises_everywhere(shm, hpccoll.ArgumentError, "shape", lambda: shm.shared_empty(shape))
        return
    try:
        shm.shared_empty(shape)
        seen = "returned"
    except hpccoll.ArgumentError as exc:
        seen = str(exc)
    everyone = shm.mpi.allgather(seen)
    assert "expected non-negative extents" in everyone[bad]
    assert all(f"rank(s) [{bad}]" in m or "shape" in m for m in everyone), everyone
    with hpccoll.Communicator(transport="shm", check=True) as checked:  # check mode: the very same message
        raises_everywhere(checked, hpccoll.ArgumentError, f"on rank {bad}", lambda: checked.shared_empty(shape))


# --------------------------------------------------------------------------- shared results


def test_zero_copy_gather_returns_the_shards_memory(shm):
    sizes = SIZE_PATTERNS["uneven"](shm.size)
    full = make((sum(sizes), 3), np.float64, seed=1)
    s = shm.shared_empty((sizes[shm.rank], 3))
    s[...] = block(full, sizes, shm.rank)
    g = hpccoll.all_gather(s, shm, out="shared")
    assert_same(g, full)
    assert not g.flags.writeable
    with pytest.raises(ValueError):
        g.flags.writeable = True
    if shm.transport_instance("shm").node.multi:  # across nodes the result is a copy, the shard stays writeable
        assert not np.shares_memory(g, s) and s.flags.writeable
        return
    assert address(g) + sum(sizes[: shm.rank]) * 24 == address(s)  # its memory
    assert not s.flags.writeable  # frozen
    with pytest.raises(ValueError, match="read-only"):
        s[...] = 0
    with pytest.raises(ValueError, match="WRITEABLE"):
        s.flags.writeable = True  # and it cannot be made writeable again
    again = hpccoll.all_gather(s, shm, out="shared")  # a frozen shard gathers again, still without copies
    assert address(again) == address(g)


def address(a):
    return a.__array_interface__["data"][0]


def test_gather_copies_when_a_shard_has_other_views(shm):
    s = shm.shared_empty((2, 2), np.int64)
    s[...] = shm.rank
    view = s[:1]  # another view of the shard: gathering without copies would freeze it under this view
    g = hpccoll.all_gather(s, shm, out="shared")
    assert not np.shares_memory(g, s) and s.flags.writeable and view.flags.writeable
    assert_same(g, np.repeat(np.arange(shm.size, dtype=np.int64), 4).reshape(-1, 2))
    s[...] = -1
    assert (g >= 0).all()  # the shared result does not change under the writes


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_shared_gather_any_axis_and_dtype(shm, dtype, axis):
    sizes = SIZE_PATTERNS["uneven"](shm.size)
    ax = axis % 2
    full = make((3, sum(sizes)) if ax == 1 else (sum(sizes), 3), dtype, seed=8)
    mine = full[:, sum(sizes[: shm.rank]) : sum(sizes[: shm.rank + 1])] if ax == 1 else block(full, sizes, shm.rank)
    for x in (np.asfortranarray(mine), shm_copy(shm, mine)):
        g = hpccoll.all_gather(x, shm, axis=axis, out="shared")
        assert_same(g, full)
        assert not g.flags.writeable
        assert all_ranks(shm, same_everywhere(shm, g))


def shm_copy(c, a):
    s = c.shared_empty(a.shape, a.dtype)
    s[...] = a
    return s


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_shared_all_reduce(shm, dtype, op):
    stack = make((shm.size, 5, 2), dtype, seed=6)
    if unsupported(dtype, op):
        raises_everywhere(
            shm, hpccoll.DTypeError, "op=", lambda: hpccoll.all_reduce(stack[shm.rank], shm, op=op, out="shared")
        )
        return
    for x in (stack[shm.rank], shm_copy(shm, stack[shm.rank])):
        got = hpccoll.all_reduce(x, shm, op=op, out="shared")
        assert not got.flags.writeable and got.dtype == dtype and got.shape == x.shape
        assert_close(got, reference(stack, op))
        assert all_ranks(shm, same_everywhere(shm, got))


def test_shared_results_never_change_while_held(shm):
    """Results held across many later shared collectives keep their values; released ones are reused."""
    held = []
    for step in range(6):
        s = shm.shared_empty(1000)
        s[...] = step * 10 + shm.rank
        held.append((step, hpccoll.all_gather(s, shm, out="shared"), hpccoll.all_reduce(s, shm, out="shared")))
        del s
    for step, g, a in held:
        assert (g.reshape(shm.size, -1) == step * 10 + np.arange(shm.size)[:, None]).all()
        assert (a == step * 10 * shm.size + sum(range(shm.size))).all()
    del held, g, a
    pool = shm.transport_instance("shm").pool
    before = len(pool.segments)
    for step in range(20):  # the steady state of a time loop: the pool reuses what every rank released
        s = shm.shared_empty(1000)
        s[...] = step
        field = hpccoll.all_gather(s, shm, out="shared")
        total = hpccoll.all_reduce(s, shm, out="shared")
        assert (field == step).all() and (total == step * shm.size).all()
    assert len(pool.segments) <= before + 4


def test_a_view_keeps_the_result_alive(shm):
    s = shm_copy(shm, np.full(4, float(shm.rank)))
    g = hpccoll.all_gather(s, shm, out="shared")
    tail = g[4:]
    del g, s
    for _ in range(3):  # new shared results must not land on memory a view still shows
        hpccoll.all_gather(shm_copy(shm, np.full(4, -1.0)), shm, out="shared")
    want = np.repeat(np.arange(1, shm.size, dtype=float), 4)
    np.testing.assert_array_equal(tail, want)


def test_bad_out_strings_and_cupy_free_errors(shm):
    raises_everywhere(
        shm,
        hpccoll.ArgumentError,
        "out: expected an array, None or 'shared'; got 'share'",
        lambda: hpccoll.all_gather(np.ones(2), shm, out="share"),
    )
    raises_everywhere(
        shm,
        hpccoll.ArgumentError,
        "out: expected an array, None or 'shared'",
        lambda: hpccoll.all_reduce(np.ones(2), shm, out="SHARED"),
    )
    raises_everywhere(
        shm,
        hpccoll.ArgumentError,
        "axis: expected an int in",
        lambda: hpccoll.all_gather(np.ones(2), shm, axis=3, out="shared"),
    )
    raises_everywhere(
        shm,
        hpccoll.ArgumentError,
        "sizes: expected",
        lambda: hpccoll.all_gather(np.ones(2), shm, sizes=[1], out="shared"),
    )
    raises_everywhere(
        shm,
        hpccoll.ArgumentError,
        "out: expected",  # a read-only shared result is no out=
        lambda: hpccoll.all_reduce(np.ones(2), shm, out=hpccoll.all_reduce(np.ones(2), shm, out="shared")),
    )


def test_shared_results_with_async_and_check_mode(shm):
    with hpccoll.Communicator(transport="shm", check=True) as c:
        req = hpccoll.all_gather(np.full(2, c.rank), c, out="shared", async_op=True)
        np.testing.assert_array_equal(req.wait(), np.repeat(np.arange(c.size), 2))
        if c.size > 1:
            shape = (3,) if c.rank == 0 else (4,)
            raises_everywhere(
                c, hpccoll.MismatchError, "disagree", lambda: hpccoll.all_reduce(np.ones(shape), c, out="shared")
            )


def test_results_outlive_the_communicator():
    c = hpccoll.Communicator(transport="shm")
    g = hpccoll.all_gather(shm_copy(c, np.full(3, c.rank)), c, out="shared")
    c.free()
    np.testing.assert_array_equal(g, np.repeat(np.arange(c.size), 3))  # still mapped (kept until exit)


def test_free_releases_the_windows():
    """``free()`` unmaps the scratch, control and released segment windows; MPI unlinks their files at once."""
    c = hpccoll.Communicator(transport="shm")
    hpccoll.all_reduce(np.ones(100), c)
    hpccoll.all_gather(shm_copy(c, np.ones(3)), c, out="shared")  # released before free
    t = c.transport_instance("shm")
    blocks = [t.node.control, t._scratch, t._stage] + [s.block for s in t.pool.segments.values()]
    addresses = [b.address for b in blocks if b is not None]
    if t.node.size == 1:  # MPI backs a one-rank node's windows with private memory, no file
        c.free()
        return
    for a in addresses:
        assert "(deleted)" in mapping_of(a)  # the backing file is gone while mapped: nothing left if killed
    c.free()
    assert all(mapping_of(a) == "" for a in addresses)


def mapping_of(address):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= address < hi:
                return line
    return ""


# --------------------------------------------------------------------------- adjoints and operators


def test_adjoints_and_operators_accept_shared_arrays(shm):
    """Shared arrays through the operators and adjoints: NumPy's results from the global data, and the dot tests."""
    P, r = shm.size, shm.rank
    sizes = SIZE_PATTERNS["uneven"](P)
    full = np.concatenate([make((sizes[q], 2), np.float64, seed=q) for q in range(P)])
    cts = np.stack([make(full.shape, np.float64, seed=100 + q) for q in range(P)])  # a different cotangent per rank
    x = shm_copy(shm, block(full, sizes, r))
    op = hpccoll.AllGather(shm, sizes=sizes)
    y = op(x)
    g = hpccoll.all_gather(x, shm, sizes=sizes, out="shared")  # freezes x: the operator still reads it
    h = op.H(shm_copy(shm, cts[r]))
    hpccoll.testing.dottest(op, x, shm_copy(shm, cts[r]))
    a = hpccoll.all_reduce(shm_copy(shm, cts[r]), shm, out="shared")
    a_adjoint = hpccoll.all_reduce_adjoint(a, shm)
    hpccoll.testing.dottest(hpccoll.AllReduce(shm), a, shm_copy(shm, cts[r] + 1))
    rs_adjoint = hpccoll.reduce_scatter_adjoint(x, shm, sizes=sizes)
    rs = hpccoll.ReduceScatter(shm, sizes=sizes)
    hpccoll.testing.dottest(rs, g, shm_copy(shm, make((sizes[r], 2), np.float64, seed=7 + r)))
    total = cts.sum(axis=0)
    assert_same(y, full)
    assert_same(g, full)
    assert_close(h, block(total, sizes, r))  # all_gather's adjoint: the sum of the cotangents, this rank's rows
    assert_close(a, total)
    assert_close(a_adjoint, total * P)  # every rank's cotangent is the same a
    assert_same(rs_adjoint, full)


# --------------------------------------------------------------------------- hierarchical and faults (own jobs)


def launch(args, env, timeout=600, n=4):
    """``python -m mpi4py args`` under ``mpiexec -n n`` in tests/, none of the suite's HPCCOLL_ settings inherited."""
    proc = run_mpiexec(
        n, [sys.executable, "-m", "mpi4py", *args], env=env, drop=("HPCCOLL_",), timeout=timeout, cwd=TESTS, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


#: The collectives' own tests (NumPy references from the global data), run through shm on simulated nodes.
COLLECTIVE_TESTS = ["test_shm.py", "test_all_gather.py", "test_reductions.py", "test_all_to_all.py"]

#: ranks, HPCCOLL_NODE_SIZE, test files: the nodes it makes.
SIMULATED_NODES = {
    "4-ranks-2-nodes-of-2": (4, "2", COLLECTIVE_TESTS),  # {0, 1} {2, 3}
    "4-ranks-2-nodes-of-2-cyclic": (4, "2,cyclic", ["test_shm.py"]),  # {0, 2} {1, 3}: not rank order
    "3-ranks-nodes-of-2-and-1": (3, "2", COLLECTIVE_TESTS),  # {0, 1} {2}: uneven nodes
    "3-ranks-nodes-of-2-and-1-cyclic": (3, "2,cyclic", ["test_shm.py"]),  # {0, 2} {1}: uneven, not rank order
    "3-ranks-single-rank-nodes": (3, "1", COLLECTIVE_TESTS),  # {0} {1} {2}: leaders only
}


@serial_only
@pytest.mark.timeout(660)  # a whole sub-suite under mpiexec: its own limit is launch()'s 600 s
@pytest.mark.parametrize("case", sorted(SIMULATED_NODES))
def test_hierarchical_simulated_nodes(case):
    """Simulated nodes: this file and the mpi transport's collective tests, all through shm."""
    n, layout, files = SIMULATED_NODES[case]
    status, output = launch(
        ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-x", *files],
        {"HPCCOLL_NODE_SIZE": layout, "HPCCOLL_TRANSPORT": "shm"},
        n=n,
    )
    assert status == 0, output[-4000:]
    assert " passed" in output and " failed" not in output, output[-2000:]


def simulated_members(size, k, cyclic):
    """The simulated nodes' ranks, each node's in rank order, nodes ordered by their lowest rank."""
    count = -(-size // k)
    if cyclic:
        return [[r for r in range(size) if r % count == j] for j in range(count)]
    return [list(range(j * k, min((j + 1) * k, size))) for j in range(count)]


@pytest.mark.parametrize("layout", ["1", "2", "3", "2,cyclic", "3,cyclic"])
def test_simulated_nodes_topology(monkeypatch, layout):
    from hpccoll.transports._shmseg import Node

    monkeypatch.setenv("HPCCOLL_NODE_SIZE", layout)
    k, cyclic = int(layout.split(",")[0]), "," in layout
    with hpccoll.Communicator(transport="shm") as c:
        node = Node(c)
        try:
            want = simulated_members(c.size, k, cyclic)
            mine = next(m for m in want if c.rank in m)
            flat = [r for m in want for r in m]
            assert node.members == want and node.index == want.index(mine), (node.members, want)
            assert node.size == len(mine) and node.rank == mine.index(c.rank)
            assert node.contiguous == (flat == list(range(c.size))) and node.multi == (len(want) > 1)
            assert (node.leaders is not None) == (node.multi and c.rank == mine[0])
            if node.leaders is not None:
                assert node.leaders.Get_size() == len(want) and node.leaders.Get_rank() == want.index(mine)
        finally:
            node.free()


STUCK = """
    import numpy as np
    import hpccoll
    comm = hpccoll.Communicator(transport="shm")
    hpccoll.all_gather(np.ones(2), comm)  # every rank sets up the node's windows
    if comm.rank == 0:
        hpccoll.{call}  # rank 1 never arrives
    print("rank", comm.rank, "past the collective", flush=True)
"""


@serial_only
@pytest.mark.parametrize(
    "call,where",
    [
        ("all_gather(np.ones(2), comm, sizes=[2, 2])", "hpccoll shm: all_gather (waiting for the other ranks"),
        ("all_reduce(np.ones(100000), comm, out='shared')", "hpccoll shm: "),  # first waits to grow the scratch
        ("all_gather(comm.shared_empty(3), comm, out='shared')", "hpccoll shm: shared_empty (waiting"),
    ],
)
def test_watchdog_covers_the_shm_waits(call, where):
    import time

    start = time.monotonic()
    status, output = launch(
        ["-c", textwrap.dedent(STUCK.format(call=call))], {"HPCCOLL_TIMEOUT": "0.5"}, timeout=90, n=2
    )
    assert status == 124 and time.monotonic() - start < 60, (status, output)
    assert "did not complete within HPCCOLL_TIMEOUT=0.5 s" in output and where in output, output


@serial_only
def test_a_rank_that_dies_ends_the_job():
    body = """
        import os, numpy as np, hpccoll
        comm = hpccoll.Communicator(transport="shm")
        s = comm.shared_empty(10)
        if comm.rank == 1:
            os._exit(3)  # dies without a word, holding node-shared memory
        hpccoll.all_gather(s, comm, out="shared")
    """
    status, output = launch(["-c", textwrap.dedent(body)], {}, timeout=90, n=2)
    assert status != 0, output
