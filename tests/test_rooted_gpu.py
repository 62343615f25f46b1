"""The GPU transports' rooted primitives (bcast, reduce, gatherv, scatterv and their I-forms), on the stand-in GPU.

Each primitive is called directly on a transport instance (``nccl``,
``staged``, ``cuda_mpi``) with flat buffers of wire dtypes, at every root,
blocking and non-blocking, and compared with NumPy references; the arrays
live on the CuPy stand-in (``tests/standin_cupy.py``), which defers device
work and detects races and uses after free, and NCCL is the NumPy-over-MPI
stand-in (``tests/standin_nccl.py``).

What the stand-in cannot model: real NCCL group semantics (it launches a
group's point-to-point calls as MPI ``Isend``/``Irecv`` posted together, so a
group NCCL would deadlock or serialise differently is not caught), NCCL's
protocol choice and performance, and CUDA-aware MPI (``cuda_mpi`` hands the
stand-in's host-backed "device" buffers to MPI through the CUDA array
interface, so a device buffer MPI could not read on a real GPU is not caught).
Where ``HostMPI`` still lacks native rooted calls, ``staged`` and ``cuda_mpi``
run the contract's defaults under their staging and synchronisation.
"""

import sys

import numpy as np
import pytest
import standin_cupy as cp
import standin_nccl as standin
from conftest import agree, assert_close, assert_same, make, reference
from standin_nccl import StandInRuntime
from test_gpu_on_cpu import CAPTURE_ERROR, StreamsRuntime

import hpccoll
from hpccoll.transports import _cuda, cuda_mpi
from hpccoll.transports import nccl as nccl_mod

pytestmark = pytest.mark.mpi

GPU_TRANSPORTS = ["nccl", "staged", "cuda_mpi"]
#: Wire dtypes the collectives hand the transports (bool reductions travel as 0/1 uint8).
MOVE_DTYPES = [np.float32, np.int16, np.complex64, np.bool_]

# Every test makes all its collective calls before its first assertion, and checks with agree(),
# so a failure on one rank fails every rank instead of leaving them waiting in a collective.


@pytest.fixture
def rt(request, monkeypatch):
    """A fresh stand-in GPU (``StandInRuntime``, or the class a test passes indirectly), the caller on a
    non-blocking stream of its own; afterwards everything queued runs, and any race fails the test."""
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    runtime = getattr(request, "param", StandInRuntime)()
    with _cuda.use_runtime(runtime), cp.cuda.Stream(non_blocking=True):
        yield runtime
        cp.GPU.synchronize()


@pytest.fixture
def transport(comm, rt, request):
    """``(communicator, transport instance)`` for the transport named by the test's ``name`` parameter."""
    name = request.node.callspec.params["name"]
    cp.cuda.Device(comm.rank % rt.devices).use()  # one GPU per rank, chosen before the transport is made
    c = hpccoll.Communicator(comm.mpi, transport=name)
    yield c, c.transport_instance(name)
    c.free()


def dev(a):
    return cp.asarray(a)


def calls(t, *names):
    """The NCCL calls transport ``t`` made, by name (empty for the MPI transports)."""
    nc = getattr(t, "_nc", None)
    return [] if nc is None else [call[0] for call in nc.calls if not names or call[0] in names]


def counts_for(pattern, size, root):
    """Uneven element counts with zeros: ``pattern`` ``"uneven"`` (2, 1, 0, 3, ...), ``"root-empty"`` (the root
    sends or gets nothing), ``"one"`` (only the last rank has data)."""
    if pattern == "uneven":
        return [(3 * r + 2) % 4 for r in range(size)]
    if pattern == "root-empty":
        return [0 if r == root else r + 2 for r in range(size)]
    return [5 if r == size - 1 else 0 for r in range(size)]


# --------------------------------------------------------------------------- bcast


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", GPU_TRANSPORTS)
def test_bcast_every_root(transport, name, dtype):
    c, t = transport
    data = make((c.size, 7), dtype, seed=1)
    got = []
    for root in range(c.size):
        buf = dev(data[c.rank])
        t.bcast(buf, root)
        other = dev(data[c.rank])
        t.ibcast(other, root).wait()
        got.append((root, buf.get(), other.get()))
    empty = cp.empty(0, dtype)
    t.bcast(empty, 0)  # nothing to move: no call, no error
    for root, blocking, started in got:
        assert_same(blocking, data[root], c)
        assert_same(started, data[root], c)
    made = calls(t)
    agree(c, name != "nccl" or c.size == 1 or (made and set(made) == {"bcast"}), lambda: f"NCCL calls {made}")


# --------------------------------------------------------------------------- reduce

#: (wire dtype, op, the NumPy reference's dtype): what the collectives send (bool as 0/1 bytes with
#: its ops on those bytes: max is OR and sum, min is AND; lxor).
REDUCE_CASES = [
    (np.float32, "sum"),
    (np.float32, "max"),
    (np.int16, "sum"),
    (np.int16, "max"),
    (np.int16, "land"),
    (np.int16, "prod"),
    (np.complex64, "sum"),
    (np.complex64, "prod"),
    ("bool", "max"),
    ("bool", "min"),
    ("bool", "lxor"),
    ("bool", "land"),
]
_BOOL_REFERENCE = {"max": "lor", "min": "land", "lxor": "lxor", "land": "land"}


def reduce_inputs(size, dtype, op, seed):
    """``(global stack in the wire dtype, reference)`` for a reduction over ranks."""
    if dtype == "bool":
        truth = make((size, 9), np.bool_, seed)
        stack = truth.view(np.uint8)
        want = reference(truth, _BOOL_REFERENCE[op]).view(np.uint8)
        return stack, want
    stack = make((size, 9), dtype, seed)
    return stack, reference(stack, op)


@pytest.mark.parametrize("dtype,op", REDUCE_CASES, ids=[f"{np.dtype(d).name}-{o}" for d, o in REDUCE_CASES])
@pytest.mark.parametrize("name", GPU_TRANSPORTS)
def test_reduce_every_root(transport, name, dtype, op):
    c, t = transport
    stack, want = reduce_inputs(c.size, dtype, op, seed=2)
    if c.size == 1 and op in ("land", "lxor") and name != "nccl":
        # MPI applies no op on one rank (a lone input is returned as it is, not as 0/1): as allreduce does
        alone = cp.empty(stack.shape[1], stack.dtype)
        t.allreduce(dev(stack[0]), alone, op)
        want = alone.get()
    got = []
    for root in range(c.size):
        recv = cp.empty(stack.shape[1], stack.dtype)
        t.reduce(dev(stack[c.rank]), recv, op, root)
        in_place = dev(stack[c.rank])
        t.reduce(None, in_place, op, root)
        started = cp.empty(stack.shape[1], stack.dtype)
        t.ireduce(dev(stack[c.rank]), started, op, root).wait()
        started_in_place = dev(stack[c.rank])
        t.ireduce(None, started_in_place, op, root).wait()
        got.append((root, [a.get() for a in (recv, in_place, started, started_in_place)]))
    for root, results in got:
        for result in results:
            agree(c, lambda: c.rank != root or assert_close(result, want), f"root {root}")
    made = calls(t, "allReduce", "reduce")
    agree(c, name != "nccl" or c.size == 1 or "allReduce" not in made, lambda: f"NCCL calls {made}")


@pytest.mark.parametrize("name", ["nccl"])
def test_nccl_reduce_refuses_as_allreduce_does(transport, name):
    """Complex max and dtypes NCCL cannot reduce are refused alike by reduce and allreduce."""
    c, t = transport
    outcomes = []
    for dtype, op in ((np.complex64, "max"), (np.bool_, "sum"), (np.int32, "band")):
        x = dev(make(4, dtype, seed=3))
        seen = []
        for call in (lambda: t.allreduce(x, cp.empty_like(x), op), lambda: t.reduce(x, cp.empty_like(x), op, 0)):
            try:
                call()
                seen.append(None)
            except hpccoll.HpccollError as exc:
                seen.append(type(exc))
        outcomes.append((dtype, op, seen))
    for dtype, op, (by_allreduce, by_reduce) in outcomes:
        agree(c, by_allreduce is not None and by_reduce is by_allreduce, f"{np.dtype(dtype)} {op}: {by_reduce}")


# --------------------------------------------------------------------------- gatherv and scatterv


@pytest.mark.parametrize("pattern", ["uneven", "root-empty", "one"])
@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", GPU_TRANSPORTS)
def test_gatherv_scatterv_every_root(transport, name, dtype, pattern):
    c, t = transport
    got = []
    for root in range(c.size):
        counts = counts_for(pattern, c.size, root)
        full = make((sum(counts),), dtype, seed=4 + root)
        lo = sum(counts[: c.rank])
        mine = full[lo : lo + counts[c.rank]]
        gathered = cp.empty(sum(counts), dtype) if c.rank == root else None
        t.gatherv(dev(mine), gathered, counts, root)
        gathered_i = cp.empty(sum(counts), dtype) if c.rank == root else None
        t.igatherv(dev(mine), gathered_i, counts, root).wait()
        source = dev(full) if c.rank == root else None
        scattered = cp.empty(counts[c.rank], dtype)
        t.scatterv(source, scattered, counts, root)
        scattered_i = cp.empty(counts[c.rank], dtype)
        t.iscatterv(source, scattered_i, counts, root).wait()
        got.append(
            (
                root,
                full,
                mine,
                [None if g is None else g.get() for g in (gathered, gathered_i)],
                scattered.get(),
                scattered_i.get(),
            )
        )
    for root, full, mine, gathers, scattered, scattered_i in got:
        for g in gathers:
            agree(c, (g is None) == (c.rank != root), f"root {root}: recv at a non-root")
            agree(c, lambda: g is None or assert_same(g, full), f"gatherv, root {root}")
        assert_same(scattered, mine, c)
        assert_same(scattered_i, mine, c)
    made = set(calls(t))
    agree(c, made <= {"send", "recv"}, lambda: f"NCCL calls {made}")


# --------------------------------------------------------------------------- NCCL specifics


@pytest.mark.parametrize("name", ["nccl"])
def test_nccl_rooted_chunked_at_the_bindings_limit(transport, name, monkeypatch):
    """Counts above the binding's limit (declared small here) are split, in every rooted primitive and path."""
    monkeypatch.setattr(standin, "MAX_COUNT", 3)
    monkeypatch.setattr(standin, "INT_COUNT_CALLS", frozenset({"broadcast", "bcast"}))
    c, t = transport
    t.max_count = 3
    root = c.size - 1
    data = make((c.size, 8), np.complex64, seed=5)  # 16 reals per message: 6 pieces
    buf = dev(data[c.rank])
    t.bcast(buf, root)
    results = [(buf.get(), data[root])]
    for dtype, op in ((np.float64, "sum"), (np.int16, "sum"), (np.complex64, "prod"), (np.int32, "land")):
        stack = make((c.size, 7), dtype, seed=6)
        recv = cp.empty(7, stack.dtype)
        t.reduce(dev(stack[c.rank]), recv, op, root)
        results.append((recv.get(), reference(stack, op)))
    counts = [7 if r % 2 == 0 else 4 for r in range(c.size)]
    full = make((sum(counts),), np.int16, seed=7)
    lo = sum(counts[: c.rank])
    gathered = cp.empty(sum(counts), full.dtype) if c.rank == root else None
    t.gatherv(dev(full[lo : lo + counts[c.rank]]), gathered, counts, root)
    scattered = cp.empty(counts[c.rank], full.dtype)
    t.scatterv(dev(full) if c.rank == root else None, scattered, counts, root)
    results.append((scattered.get(), full[lo : lo + counts[c.rank]]))
    assert_same(results[0][0], results[0][1], c)
    for g, w in results[1:-1]:
        agree(c, lambda: c.rank != root or assert_close(g, w))
    agree(c, lambda: gathered is None or assert_same(gathered.get(), full))
    assert_same(results[-1][0], results[-1][1], c)
    biggest = max([n for _, n, *_ in t._nc.calls] or [0])
    agree(c, biggest <= 3, f"a call of {biggest} elements")


@pytest.mark.parametrize("name", ["nccl"])
def test_nccl_rooted_errors(transport, name):
    """An asynchronous NCCL error surfaces at the next rooted call (CollectiveError, communicator aborted);
    afterwards the transport is closed (TransportUnavailable)."""
    c, t = transport
    x = cp.ones(4)
    t.bcast(x, 0)
    t._nc.inject_async_error("stand-in")
    seen = []
    for call in (
        lambda: t.reduce(x, cp.empty(4), "sum", 0),
        lambda: t.igatherv(x, cp.empty(4 * c.size), [4] * c.size, 0),
    ):
        try:
            call()
            seen.append(None)
        except hpccoll.HpccollError as exc:
            seen.append(type(exc))
    agree(c, seen == [hpccoll.CollectiveError, hpccoll.TransportUnavailable], f"raised {seen}")


# --------------------------------------------------------------------------- staged and cuda_mpi specifics


@pytest.mark.parametrize("name", ["staged"])
def test_staged_composes_the_host_transport(transport, name):
    c, t = transport
    agree(c, t._host is c.host_transport(), "staged made a private host transport")


@pytest.mark.parametrize("rt", [StreamsRuntime], indirect=True)
@pytest.mark.parametrize("name", ["staged", "cuda_mpi"])
def test_rooted_refuse_capture_on_every_rank(transport, rt, name):
    """During stream capture every rank refuses, the root and the others alike, before any MPI call."""
    c, t = transport
    x = dev(np.ones(3))
    counts = [3] * c.size
    rt.capturing = True
    calls_ = [
        lambda: t.bcast(x, 0),
        lambda: t.reduce(x, cp.empty(3), "sum", 0),
        lambda: t.gatherv(x, cp.empty(3 * c.size) if c.rank == 0 else None, counts, 0),
        lambda: t.scatterv(dev(np.ones(3 * c.size)) if c.rank == 0 else None, cp.empty(3), counts, 0),
        lambda: t.ibcast(x, 0),
    ]
    seen = []
    for call in calls_:
        try:
            call()
            seen.append("no error")
        except hpccoll.TransportUnavailable as exc:
            seen.append("capture" if CAPTURE_ERROR in str(exc.__cause__) and "stream capture" in str(exc) else str(exc))
    rt.capturing = False
    # the refused calls left their copies into the pinned buffers queued: let them finish before close() frees them
    cp.get_current_stream().synchronize()
    agree(c, seen == ["capture"] * len(calls_), f"{seen}")


# --------------------------------------------------------------------------- the public functions on the stand-in


@pytest.mark.parametrize("name", GPU_TRANSPORTS)
def test_public_rooted_collectives_on_cupy_arrays(transport, name):
    """hpccoll.broadcast/reduce/gather/scatter and their adjoints with CuPy (stand-in) arrays, every root,
    blocking and not, against NumPy: the road from the public functions to each GPU transport."""
    c, _ = transport
    P, me = c.size, c.rank
    rng = np.random.default_rng(5)
    stack = rng.standard_normal((P, 4, 3)).astype(np.float32)
    ints = rng.integers(-50, 50, (P, 5)).astype(np.int16)
    sizes = [(q + 1) % 3 for q in range(P)]  # uneven, with a 0 where P >= 3
    whole = rng.standard_normal((sum(sizes), 2))
    got, want = [], []
    for root in range(P):
        mine = root == me
        got.append(hpccoll.broadcast(dev(stack[me]), c, root=root).get())
        want.append(stack[root])
        got.append(hpccoll.broadcast(dev(stack[me]), c, root=root, async_op=True).wait().get())
        want.append(stack[root])
        got.append(hpccoll.reduce(dev(ints[me]), c, root=root).get())
        want.append(ints.sum(0, dtype=np.int16) if mine else np.zeros(5, np.int16))
        got.append(hpccoll.reduce(dev(ints[me]), c, op="max", root=root, async_op=True).wait().get())
        want.append(ints.max(0) if mine else np.zeros(5, np.int16))
        got.append(hpccoll.broadcast_adjoint(dev(stack[me]), c, root=root).get())
        want.append(reference(stack, "sum") if mine else np.zeros((4, 3), np.float32))
        lo = sum(sizes[:me])
        own = whole[lo : lo + sizes[me]]
        got.append(hpccoll.gather(dev(own), c, root=root).get())
        want.append(whole if mine else whole[:0])
        src = whole if mine else whole[:0]
        got.append(hpccoll.scatter(dev(src), c, root=root, sizes=sizes).get())
        want.append(own)
        got.append(hpccoll.gather_adjoint(dev(src), c, root=root, sizes=sizes, async_op=True).wait().get())
        want.append(own)
        got.append(hpccoll.gather(dev(own.T.copy()), c, root=root, axis=1).get())  # an inner axis: unpacked
        want.append(whole.T if mine else whole.T[:, :0])
    results = [(g.dtype == w.dtype and g.shape == w.shape) for g, w in zip(got, want)]
    agree(c, all(results), f"dtype or shape differs in case(s) {[i for i, ok in enumerate(results) if not ok]}")
    for g, w in zip(got, want):
        if w.dtype == np.float32 and w.shape == (4, 3):
            assert_close(g, w, c, slack=np.abs(stack).sum(0) * 2e-7)
        else:
            assert_same(g, w, c)


@pytest.mark.parametrize("name", GPU_TRANSPORTS)
def test_halo_exchange_on_cupy_arrays(transport, name):
    """halo_exchange and its adjoint with CuPy (stand-in) arrays on each GPU transport: the contract's sendrecv
    (NCCL and staged: its default, one all-to-all of packed bytes; cuda_mpi: host MPI's messages on device
    buffers), against the same exchange of NumPy arrays over host MPI; and planned, in place and not (a plan's
    sendrecv is the contract's default prepared call on every GPU transport)."""
    c, _ = transport
    grid = c.cartesian([c.size], periodic=True)
    host = hpccoll.Communicator(c.mpi, transport="mpi").cartesian([c.size], periodic=True)
    try:
        rng = np.random.default_rng(c.rank)
        x = rng.standard_normal((6, 3)).astype(np.float32)
        g = rng.standard_normal((6, 3)).astype(np.float32)
        got = [
            hpccoll.halo_exchange(dev(x), grid, halo=2).get(),
            hpccoll.halo_exchange(dev(x.T.copy()).T, grid, halo=2).get(),  # non-contiguous faces: packed
            hpccoll.halo_exchange_adjoint(dev(g), grid, halo=2, async_op=True).wait().get(),
        ]
        inplace = dev(x)
        with hpccoll.plan(hpccoll.halo_exchange, inplace, grid, halo=2, out=inplace) as planned:
            got.append(planned().get())
        adjoint_in = dev(g)
        with hpccoll.plan(hpccoll.halo_exchange_adjoint, adjoint_in, grid, halo=2) as planned:
            for _ in range(2):  # the plan reads its input's current contents at each run
                got.append(planned().get())
                adjoint_in[...] = dev(x)
        want = [
            hpccoll.halo_exchange(x, host, halo=2),
            hpccoll.halo_exchange(x, host, halo=2),
            hpccoll.halo_exchange_adjoint(g, host, halo=2),
            hpccoll.halo_exchange(x, host, halo=2),
            hpccoll.halo_exchange_adjoint(g, host, halo=2),
            hpccoll.halo_exchange_adjoint(x, host, halo=2),
        ]
    finally:
        grid.free()
        host.free()
    for a, b in zip(got, want):
        assert_same(a, b, c)
