"""The GPU transports' own logic in CPU-only CI, against a stand-in for CuPy's NCCL binding.

The real ``hpccoll/transports/nccl.py`` (and ``staged.py``, ``cuda_mpi.py``)
run here; only the NCCL binding and the CuPy runtime are replaced, by the
NumPy-over-MPI stand-in in ``tests/standin_nccl.py`` (a test fixture, never a
transport). For the tests through the public API, ``select_transport`` in
``hpccoll._api`` is pointed at the CuPy-side choice, so NumPy arrays take the
GPU code path; everything else (axes, uneven sizes, dtype plans, ``avg``) is
the library's own.
"""

import numpy as np
import pytest

import hpccoll
import standin_nccl as standin
from conftest import DTYPE_IDS, DTYPES, SIZE_PATTERNS, assert_close, assert_same, make, reference
from hpccoll.transports import _cuda, choose_transport, cuda_mpi
from hpccoll.transports import nccl as nccl_mod
from standin_nccl import MPIStandInNcclCommunicator, StandInRuntime
from test_all_gather import shards
from test_reductions import OPS, block, stack_for, unsupported

pytestmark = pytest.mark.mpi

# Every test makes all its collective calls before its first assertion, so a
# failure on one rank cannot leave the other ranks waiting in a collective.


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def runtime(monkeypatch):
    """The stand-in CuPy runtime, installed for the test; hpccoll's GPU choice reset."""
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    rt = StandInRuntime()
    with _cuda.use_runtime(rt):
        yield rt


@pytest.fixture
def fresh(comm, runtime):
    """Make fresh Communicators (freed after the test), so probes and choices start clean."""
    made = []

    def new(**kwargs):
        made.append(hpccoll.Communicator(comm.mpi, **kwargs))
        return made[-1]

    yield new
    for c in reversed(made):
        c.free()


def route_to_cupy_transports(monkeypatch):
    """Send NumPy arrays through the transports CuPy arrays would use (the stand-ins).

    Every collective reaches the network through ``Communicator.transport_of``
    (its common-case branch too), so this one patch routes them all.
    """
    transport_of = hpccoll.Communicator.transport_of
    monkeypatch.setattr(hpccoll.Communicator, "transport_of", lambda c, kind, nbytes=0: transport_of(c, "cupy", nbytes))


@pytest.fixture
def gpu(fresh, monkeypatch):
    """A Communicator whose collectives take the CuPy-side transports (NCCL over the stand-in)."""
    route_to_cupy_transports(monkeypatch)
    return fresh()


def nccl_of(c):
    return c.transport_instance("nccl")


def calls(c, *names):
    """The NCCL calls the communicator's transport made (optionally only those named)."""
    log = nccl_of(c)._nc.calls
    return [call for call in log if not names or call[0] in names]


# --------------------------------------------------------------------------- the public API over NCCL


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_every_dtype_and_op(gpu, dtype, op):
    stack, x = stack_for(gpu, (2 * gpu.size + 1, 3), dtype, seed=11)
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.reduce_scatter(x, gpu, op=op)
        return
    scattered = hpccoll.reduce_scatter(x, gpu, op=op)
    reduced = hpccoll.all_reduce(x, gpu, op=op)
    y = x.copy()
    in_place = hpccoll.all_reduce(y, gpu, op=op, out=y)
    want = reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], gpu.size)
    assert_close(scattered, block(want, 0, sizes, gpu.rank))
    assert_close(reduced, want)
    assert in_place is y
    assert_close(y, want)
    assert choose_transport(gpu, "cupy").name == "nccl"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_every_dtype(gpu, dtype):
    sizes = SIZE_PATTERNS["uneven"](gpu.size)
    x, full = shards(gpu, (2, 0, 3), 1, sizes, dtype)
    assert_same(hpccoll.all_gather(x, gpu, axis=1), full)


@pytest.mark.parametrize("design", ["grouped", "pad", "auto"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_uneven_designs(gpu, design, pattern):
    nccl_of(gpu).uneven = design
    sizes = SIZE_PATTERNS[pattern](gpu.size)
    x, full = shards(gpu, (3, 0, 2), 1, sizes, np.float32, seed=4)
    gathered = hpccoll.all_gather(x, gpu, axis=1, sizes=sizes)
    stack, z = stack_for(gpu, (3, sum(sizes), 2), np.int64, seed=5)
    scattered = hpccoll.reduce_scatter(z, gpu, axis=-2, sizes=sizes)
    assert_same(gathered, full)
    assert_close(scattered, block(reference(stack, "sum"), 1, sizes, gpu.rank))
    counts = [s * 6 for s in sizes]
    even = len(set(counts)) == 1
    padded = gpu.size * max(counts) <= (1 + nccl_mod.PAD_SLACK) * sum(counts)
    used = {call[0] for call in calls(gpu)}
    if gpu.size == 1:
        assert used == set()  # one rank: the API copies, NCCL is not called
    elif even or design == "pad" or (design == "auto" and padded):
        assert used == {"allGather", "reduceScatter"}
    else:
        assert used == {"broadcast", "reduce"}


def test_axis_and_layouts_with_out(gpu):
    sizes = SIZE_PATTERNS["empty-last"](gpu.size)
    x, full = shards(gpu, (2, 3, 0), 2, sizes, np.complex128, seed=8)
    out = np.asfortranarray(np.empty_like(full))
    assert hpccoll.all_gather(np.asfortranarray(x), gpu, axis=-1, out=out) is out
    assert_same(out, full)


# --------------------------------------------------------------------------- dtypes and ops on the wire


def wire_types(c, *names):
    return {call[2] for call in calls(c, *names)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype,nccl_type,scale",
    [("bool", "NCCL_UINT8", 1), ("int16", "NCCL_UINT8", 2), ("uint16", "NCCL_UINT8", 2),
     ("complex64", "NCCL_FLOAT32", 2), ("complex128", "NCCL_FLOAT64", 2), ("float16", "NCCL_FLOAT16", 1),
     ("bfloat16", "NCCL_UINT8", 2), ("int64", "NCCL_INT64", 1)],
)
def test_movement_types(gpu, dtype, nccl_type, scale):
    dtype = [d for d in DTYPES if d.name == dtype][0]
    x, full = shards(gpu, (0,), 0, [2] * gpu.size, dtype)
    assert_same(hpccoll.all_gather(x, gpu), full)
    assert calls(gpu) == [("allGather", 2 * scale, getattr(standin, nccl_type), None, None, StandInRuntime.STREAM)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "dtype,op,nccl_type,nccl_op,scale",
    [("int16", "sum", "NCCL_INT32", "NCCL_SUM", 1), ("uint16", "prod", "NCCL_UINT32", "NCCL_PROD", 1),
     ("bool", "sum", "NCCL_UINT8", "NCCL_MAX", 1), ("bool", "prod", "NCCL_UINT8", "NCCL_MIN", 1),
     ("float16", "avg", "NCCL_FLOAT16", "NCCL_SUM", 1), ("bfloat16", "max", "NCCL_BFLOAT16", "NCCL_MAX", 1),
     ("complex64", "sum", "NCCL_FLOAT32", "NCCL_SUM", 2), ("complex128", "avg", "NCCL_FLOAT64", "NCCL_SUM", 2)],
)
def test_reduction_types(gpu, dtype, op, nccl_type, nccl_op, scale):
    dtype = [d for d in DTYPES if d.name == dtype][0]
    stack, x = stack_for(gpu, (5,), dtype, seed=3)
    assert_close(hpccoll.all_reduce(x, gpu, op=op), reference(stack, op))
    want = ("allReduce", 5 * scale, getattr(standin, nccl_type), getattr(standin, nccl_op), None, StandInRuntime.STREAM)
    assert calls(gpu) == [want]


@pytest.mark.mpi(min_size=2)
def test_bfloat16_widened_before_nccl_2_10(gpu, monkeypatch):
    monkeypatch.setattr(standin, "VERSION", 20903)
    dtype = [d for d in DTYPES if d.name == "bfloat16"][0]
    stack, x = stack_for(gpu, (4,), dtype, seed=2)
    got = hpccoll.all_reduce(x, gpu, op="sum")
    assert "bfloat16" not in nccl_of(gpu).native_reduce
    assert_close(got, reference(stack, "sum"))
    assert wire_types(gpu) == {standin.NCCL_FLOAT32}


def test_native_reduce(gpu):
    assert nccl_of(gpu).native_reduce == frozenset({"float16", "bfloat16"})


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_prod_by_all_to_all(gpu, dtype):
    stack, x = stack_for(gpu, (2 * gpu.size + 1,), np.dtype(dtype), seed=6)
    scattered = hpccoll.reduce_scatter(x, gpu, op="prod")
    reduced = hpccoll.all_reduce(x, gpu, op="prod")
    y = x.copy()
    hpccoll.all_reduce(y, gpu, op="prod", out=y)
    want = reference(stack, "prod")
    assert_close(scattered, block(want, 0, hpccoll.split_sizes(x.size, gpu.size), gpu.rank))
    assert_close(reduced, want)
    assert_close(y, want)
    if gpu.size > 1:  # complex products are not elementwise on reals: blocks travel, then multiply
        assert {"send", "recv"} <= {call[0] for call in calls(gpu)}
        real = standin.NCCL_FLOAT32 if dtype == "complex64" else standin.NCCL_FLOAT64
        assert wire_types(gpu, "send", "recv") == {real}


def test_complex_max_refused(gpu):
    x = np.ones(3, np.complex64)
    with pytest.raises(hpccoll.DTypeError, match="op='max'"):
        hpccoll.all_reduce(x, gpu, op="max")
    t = nccl_of(gpu)
    with pytest.raises(hpccoll.DTypeError, match="op='min'"):
        t.allreduce(None, x, "min")
    assert calls(gpu) == []


# --------------------------------------------------------------------------- chunking


def test_chunking_with_a_tiny_limit(gpu, monkeypatch):
    t = nccl_of(gpu)
    t.max_count = 3
    got, want = [], []
    stack, x = stack_for(gpu, (7, 2), np.float64, seed=1)
    got.append(hpccoll.all_reduce(x, gpu))
    want.append(reference(stack, "sum"))
    even = [4] * gpu.size  # 4 elements per rank > 3: the even path must split too
    g, full = shards(gpu, (0,), 0, even, np.int32)
    got.append(hpccoll.all_gather(g, gpu, sizes=even))
    want.append(full)
    stack, z = stack_for(gpu, (4 * gpu.size,), np.int32, seed=2)
    got.append(hpccoll.reduce_scatter(z, gpu, sizes=even))
    want.append(block(reference(stack, "sum"), 0, even, gpu.rank))
    stack, c = stack_for(gpu, (3 * gpu.size,), np.complex64, seed=3)
    got.append(hpccoll.all_reduce(c, gpu, op="prod"))
    want.append(reference(stack, "prod"))
    t.uneven = "pad"  # a padded block above the limit falls back to grouped calls
    uneven = [5 if r == 0 else 1 for r in range(gpu.size)]
    g, full = shards(gpu, (0,), 0, uneven, np.float32)
    got.append(hpccoll.all_gather(g, gpu, sizes=uneven))
    want.append(full)
    for a, b in zip(got, want):
        assert_close(a, b)
    if gpu.size > 1:
        assert calls(gpu) and max(call[1] for call in calls(gpu)) <= 3


@pytest.mark.parametrize("design", ["grouped", "pad"])
def test_primitives_directly(gpu, design):
    """The transport's primitives on flat buffers, at every size including one rank."""
    t = nccl_of(gpu)
    t.uneven = design
    t.max_count = 5
    counts = [r % 3 + 2 for r in range(gpu.size)]
    full = make((sum(counts),), np.float64, seed=9)
    start = sum(counts[: gpu.rank])
    recv = np.empty_like(full)
    t.allgatherv(full[start : start + counts[gpu.rank]].copy(), recv, counts)
    stack = make((gpu.size, sum(counts)), np.float64, seed=10)
    mine = np.empty(counts[gpu.rank])
    t.reduce_scatter(stack[gpu.rank].copy(), mine, counts, "max")
    y = stack[gpu.rank].copy()
    t.allreduce(None, y, "min")
    assert_same(recv, full)
    assert_close(mine, stack.max(axis=0)[start : start + counts[gpu.rank]])
    assert_close(y, stack.min(axis=0))


# --------------------------------------------------------------------------- bootstrap


@pytest.mark.parametrize("form", ["bytes", "tuple"])
def test_unique_id_forms(gpu, monkeypatch, form):
    monkeypatch.setattr(standin, "ID_FORM", form)
    before = MPIStandInNcclCommunicator.created
    t = nccl_of(gpu)
    x = make((3,), np.float32, seed=gpu.rank)
    t.allreduce(None, x, "sum")
    assert isinstance(t._nc, MPIStandInNcclCommunicator)
    assert MPIStandInNcclCommunicator.created == before + 1
    assert_close(x, sum(make((3,), np.float32, seed=r) for r in range(gpu.size)))


def test_id_forms_cover_both_bindings():
    raw = bytes(range(128, 256))
    forms = nccl_mod._id_forms(raw)
    assert forms[0] == raw and tuple(raw) in forms and tuple(b - 256 for b in raw) in forms
    signed = tuple(b - 256 for b in raw)
    assert nccl_mod._id_forms(signed)[:2] == [signed, raw]


def test_unique_id_failure_raises_on_every_rank(gpu, monkeypatch):
    monkeypatch.setattr(standin, "FAIL_UNIQUE_ID", True)  # only rank 0 calls get_unique_id
    for _ in range(2):  # and again: no rank is left waiting in a collective
        with pytest.raises(hpccoll.TransportUnavailable, match="rank 0 could not make the NCCL unique id"):
            gpu.transport_instance("nccl")
    monkeypatch.setattr(standin, "FAIL_UNIQUE_ID", False)
    x = np.ones(4)
    nccl_of(gpu).allreduce(None, x, "sum")
    np.testing.assert_array_equal(x, np.full(4, gpu.size))


def test_streams_are_the_callers(gpu):
    stack, x = stack_for(gpu, (6,), np.float32, seed=0)
    hpccoll.all_reduce(x, gpu)
    hpccoll.reduce_scatter(x, gpu)
    hpccoll.all_gather(x, gpu)
    assert {call[5] for call in calls(gpu)} <= {StandInRuntime.STREAM}


# --------------------------------------------------------------------------- selection and the probe


def test_auto_picks_nccl(fresh, runtime):
    c = fresh()
    choice = c.transport_for(np.zeros(2))
    assert choice == ("mpi", "auto: NumPy arrays use host MPI")
    choice = choose_transport(c, "cupy")
    assert choice.name == "nccl" and "usable" in choice.reason
    t = nccl_of(c)
    assert t.device == runtime.current and "node-local rank" in t.device_choice


@pytest.mark.mpi(min_size=2)
def test_two_ranks_on_one_gpu_refused_and_auto_falls_back(fresh, runtime):
    runtime.devices = 1  # every rank picks GPU 0: same node, same bus id
    c = fresh()
    with pytest.warns(RuntimeWarning, match="HPCCOLL_CUDA_AWARE_MPI is not set"):
        choice = choose_transport(c, "cupy")
    assert choice.name == "staged" and "share one GPU" in choice.reason
    explicit = fresh(transport="nccl")
    for _ in range(2):  # the refusal is cached, and raised again
        with pytest.raises(hpccoll.TransportUnavailable, match=r"ranks 0 and 1 would share one GPU \(PCI bus"):
            choose_transport(explicit, "cupy")


@pytest.mark.mpi(min_size=2)
def test_auto_falls_back_to_declared_cuda_mpi(fresh, runtime, monkeypatch):
    runtime.devices = 1
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1")
    choice = choose_transport(fresh(), "cupy")
    assert choice.name == "cuda_mpi" and "HPCCOLL_CUDA_AWARE_MPI=1" in choice.reason


def test_one_rank_on_one_gpu_is_fine(comm, fresh, runtime):
    runtime.devices = 1
    solo = fresh().split(comm.rank)  # a one-rank communicator on every rank
    try:
        assert choose_transport(solo, "cupy").name == "nccl"
        assert nccl_of(solo).device == 0
    finally:
        solo.free()


@pytest.mark.parametrize(
    "setup,match",
    [("no-nccl", "NCCL is missing"), ("no-gpu", "no GPU"), ("broken-bus", "RuntimeError: bus")],
)
def test_unusable_reasons(fresh, runtime, setup, match):
    if setup == "no-nccl":
        runtime.nccl, runtime.nccl_missing = None, "stand-in: NCCL switched off"
    elif setup == "no-gpu":
        runtime.devices = 0
    else:
        def bus(d):
            raise RuntimeError("bus")

        runtime.bus_ids = bus
    with pytest.raises(hpccoll.TransportUnavailable, match=f"transport 'nccl' cannot run here: .*{match}"):
        choose_transport(fresh(transport="nccl"), "cupy")
    with pytest.warns(RuntimeWarning, match="HPCCOLL_CUDA_AWARE_MPI is not set"):
        choice = choose_transport(fresh(), "cupy")
    assert choice.name == "staged" and match in choice.reason


@pytest.mark.mpi(min_size=2)
def test_one_rank_without_nccl_stops_every_rank(fresh, runtime):
    c = fresh()
    if c.rank == 1:
        runtime.nccl, runtime.nccl_missing = None, "stand-in: NCCL switched off"
    with pytest.raises(hpccoll.TransportUnavailable, match="rank 1: NCCL is missing"):
        c.transport_instance("nccl")


def test_without_cupy(fresh, comm):
    """The real runtime, in an environment without CuPy (CI): a clear reason, on every rank."""
    try:
        import cupy  # noqa: F401
        have = True
    except Exception:
        have = False
    have = comm.mpi.allreduce(have)
    if have:
        pytest.skip("CuPy is installed here")  # the same on every rank
    with _cuda.use_runtime(None):
        with pytest.raises(hpccoll.TransportUnavailable, match="no transport can move CuPy arrays here: CuPy is not"):
            choose_transport(fresh(), "cupy")
        with pytest.raises(hpccoll.TransportUnavailable, match="transport 'staged' cannot run here: CuPy"):
            choose_transport(fresh(transport="staged"), "cupy")
        assert fresh().transport_for(np.ones(1)).name == "mpi"


def test_requested_names(fresh, runtime, monkeypatch):
    assert choose_transport(fresh(transport="mpi"), "cupy").name == "staged"
    assert choose_transport(fresh(transport="staged"), "cupy") == ("staged", "transport='staged' requested")
    choice = fresh(transport="nccl").transport_for([1, 2])
    assert choice.name == "mpi" and "applies to CuPy arrays" in choice.reason
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "cuda_mpi")
    c = fresh()
    assert c.transport == "cuda_mpi" and choose_transport(c, "cupy").name == "cuda_mpi"
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "gpu")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_TRANSPORT: expected one of"):
        fresh()


def test_uneven_setting_validated(fresh, runtime, monkeypatch):
    monkeypatch.setenv("HPCCOLL_NCCL_UNEVEN", "pad")
    assert nccl_of(fresh()).uneven == "pad"
    monkeypatch.setenv("HPCCOLL_NCCL_UNEVEN", "sometimes")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_NCCL_UNEVEN: expected one of 'auto', 'grouped', 'pad'"):
        nccl_of(fresh())
    monkeypatch.delenv("HPCCOLL_NCCL_UNEVEN")
    t = nccl_of(fresh())
    with pytest.raises(hpccoll.ArgumentError, match="uneven: expected one of"):
        t.uneven = "padded"


def test_array_on_another_gpu_refused(gpu, runtime):
    t = nccl_of(gpu)
    runtime.array_device = t.device + 1
    with pytest.raises(hpccoll.ArgumentError, match=f"expected a CuPy array on GPU {t.device}"):
        t.allreduce(None, np.ones(2), "sum")
    assert calls(gpu) == []


def test_selected_device_wins(comm, fresh, runtime):
    runtime.current = 3  # the user selected GPU 3 before hpccoll's first use
    runtime.bus_ids = lambda d: f"0000:{comm.rank + 1:02X}:00.{d}"  # as if each rank had its own node
    t = nccl_of(fresh())
    assert t.device == 3 and "current device" in t.device_choice


# --------------------------------------------------------------------------- lifetime


def test_split_gets_its_own_nccl_communicator(gpu):
    parent = nccl_of(gpu)
    sub = gpu.split(gpu.rank % 2)
    try:
        stack, x = stack_for(sub, (5,), np.float64, seed=4)
        assert_close(hpccoll.all_reduce(x, sub), reference(stack, "sum"))
        child = nccl_of(sub)
        assert child is not parent and child._nc is not parent._nc and child.device == parent.device
    finally:
        before = MPIStandInNcclCommunicator.destroyed
        sub.free()
        assert MPIStandInNcclCommunicator.destroyed == before + 1


def test_free_and_exit_destroy_nccl(fresh):
    c = fresh()
    t = nccl_of(c)
    before = MPIStandInNcclCommunicator.destroyed
    c.free()
    after_free = MPIStandInNcclCommunicator.destroyed
    c.free()  # idempotent
    d = fresh()
    u = nccl_of(d)
    nccl_mod._close_all()  # what the atexit hook does before MPI finalizes
    assert t._nc is None and after_free == before + 1
    assert u._nc is None and MPIStandInNcclCommunicator.destroyed == before + 2
    with pytest.raises(hpccoll.TransportUnavailable, match="closed"):
        u.allreduce(None, np.ones(1), "sum")


# --------------------------------------------------------------------------- staged and cuda_mpi


@pytest.fixture
def routed(monkeypatch):
    route_to_cupy_transports(monkeypatch)


def test_staged_reuses_pinned_buffers(fresh, runtime, routed):
    c = fresh(transport="staged")
    stack, x = stack_for(c, (4 * c.size, 3), np.float32, seed=1)
    repeated = [hpccoll.all_reduce(x, c) for _ in range(3)]
    y = x.copy()
    hpccoll.all_reduce(y, c, out=y)
    scattered = hpccoll.reduce_scatter(x, c)
    allocations = len(runtime.pinned_allocations)
    big = np.ones(1 << 19)  # 4 MiB: grows both buffers
    grown = hpccoll.all_reduce(big, c)
    want = reference(stack, "sum")
    for got in repeated + [y]:
        assert_close(got, want)
    assert_close(scattered, block(want, 0, hpccoll.split_sizes(x.shape[0], c.size), c.rank))
    assert_close(grown, np.full(big.shape, float(c.size)))
    if c.size > 1:  # (one rank: the API copies without a transport)
        assert allocations == 2  # one send and one receive buffer, reused by five calls
        assert len(runtime.pinned_allocations) == 4
        assert runtime.syncs == 6 and c.transport_instance("staged").pinned_bytes >= 2 * big.nbytes


def test_cuda_mpi_syncs_the_current_stream(fresh, runtime, routed):
    c = fresh(transport="cuda_mpi")
    stack, x = stack_for(c, (3 * c.size,), np.int64, seed=2)
    reduced = hpccoll.all_reduce(x, c, op="max")
    g, full = shards(c, (0,), 0, SIZE_PATTERNS["uneven"](c.size), np.int16)
    gathered = hpccoll.all_gather(g, c)
    assert_close(reduced, reference(stack, "max"))
    assert_same(gathered, full)
    assert runtime.syncs == (2 if c.size > 1 else 0)


def test_cuda_aware_setting(fresh, runtime, monkeypatch):
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "0")
    with pytest.raises(hpccoll.TransportUnavailable, match="HPCCOLL_CUDA_AWARE_MPI=0 declares"):
        choose_transport(fresh(transport="cuda_mpi"), "cupy")
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "maybe")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_CUDA_AWARE_MPI: expected 1/true/yes/on or 0/false/no/off; got .maybe."):
        choose_transport(fresh(transport="cuda_mpi"), "cupy")


@pytest.mark.mpi(min_size=2)
def test_cuda_aware_setting_must_agree(fresh, runtime, monkeypatch):
    c = fresh()
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "1" if c.rank == 0 else "0")
    with pytest.raises(hpccoll.MismatchError, match="HPCCOLL_CUDA_AWARE_MPI: rank 0 has '1' but rank 1 has '0'"):
        cuda_mpi.cuda_aware(c)


# --------------------------------------------------------------------------- async, in place, lists over NCCL


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_async_in_place_and_lists(gpu, pattern, monkeypatch):
    """Event-backed requests, in-place forms (copied first: NCCL transport has no send=None), lists."""
    sizes = SIZE_PATTERNS[pattern](gpu.size)
    x, full = shards(gpu, (0, 3), 0, sizes, np.float32, seed=3)
    req = hpccoll.all_gather(x, gpu, sizes=sizes, async_op=True)
    got_async = req.wait()
    out = np.zeros_like(full)
    lo = sum(sizes[: gpu.rank])
    out[lo : lo + sizes[gpu.rank]] = x
    got_in_place = hpccoll.all_gather(out[lo : lo + sizes[gpu.rank]], gpu, sizes=sizes, out=out)
    stack, y = stack_for(gpu, (2 * gpu.size + 1, 2), np.float64, seed=4)
    rs_want_sizes = hpccoll.split_sizes(y.shape[0], gpu.size)
    req_rs = hpccoll.reduce_scatter(y, gpu, op="avg", async_op=True)
    polled = req_rs.test()  # the stand-in's event reports done once the work is enqueued
    got_rs = req_rs.wait()
    got_list = hpccoll.all_reduce([y, y[:1].copy()], gpu)
    assert polled and req_rs.done
    assert_same(got_async, full)
    assert got_in_place is out
    assert_same(out, full)
    assert_close(got_rs, block(reference(stack, "avg"), 0, rs_want_sizes, gpu.rank))
    assert_close(got_list[0], reference(stack, "sum"))
    assert_close(got_list[1], reference(stack[:, :1], "sum"))


# --------------------------------------------------------------------------- faults: async errors, timeouts


class _NcclError(Exception):
    pass


@pytest.mark.mpi(min_size=2)  # one rank never reaches NCCL
def test_async_error_surfaces_and_aborts(gpu, monkeypatch):
    """An asynchronous NCCL error is raised as CollectiveError at the next call; the communicator is aborted."""
    x = np.ones(4)
    hpccoll.all_reduce(x, gpu)  # creates the NCCL communicator
    nc = nccl_of(gpu)._nc
    aborted = []
    monkeypatch.setattr(nc, "check_async_error", lambda: (_ for _ in ()).throw(_NcclError("unhandled cuda error")))
    monkeypatch.setattr(nc, "abort", lambda: aborted.append(True))
    with pytest.raises(hpccoll.CollectiveError, match="asynchronous error.*unhandled cuda error"):
        hpccoll.all_reduce(x, gpu)
    with pytest.raises(hpccoll.TransportUnavailable, match="closed"):
        hpccoll.all_reduce(x, gpu)
    assert aborted == [True]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True])
def test_stuck_collective_times_out(gpu, runtime, monkeypatch, async_op):
    """Under HPCCOLL_TIMEOUT a collective whose event never completes aborts NCCL and raises, on every rank."""
    import time

    class Stuck:
        done = False

        def synchronize(self):  # never reached under a timeout
            raise AssertionError("waited without the watchdog")

    x = np.ones(4)
    hpccoll.all_reduce(x, gpu)  # creates the NCCL communicator
    monkeypatch.setattr(gpu, "timeout", 0.2)
    monkeypatch.setattr(runtime, "record", lambda: Stuck())
    t0 = time.monotonic()
    with pytest.raises(hpccoll.CollectiveError, match="did not complete within HPCCOLL_TIMEOUT=0.2 s"):
        req = hpccoll.all_reduce(x, gpu, async_op=async_op)
        if async_op:
            assert not req.test()
            req.wait()
    assert 0.2 <= time.monotonic() - t0 < 5
