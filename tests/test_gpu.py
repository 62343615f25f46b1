"""Real GPU tests: CuPy arrays over nccl, staged and cuda_mpi (``make test-gpu``).

Skipped, and reported as skipped at the end of the run, without CuPy or a
GPU. ``cuda_mpi`` runs only where MPI says it is CUDA-aware, or
``HPCCOLL_CUDA_AWARE_MPI=1`` declares it (handing device pointers to a host-only
MPI crashes). NCCL
needs one GPU per rank, unless NCCL >= 2.30 runs with
``NCCL_MULTI_RANK_GPU_ENABLE=1`` (its experimental multi-rank mode; ``make
gpu-check`` runs the suite so at 2 and 4 ranks on one GPU): otherwise, where
ranks outnumber GPUs, its refusal is tested.

Every rank selects its GPU from its node-local rank before allocating, as
a user program should (hpccoll's NCCL transport would pick the same one).
"""

import os

import numpy as np
import pytest
from conftest import (
    DTYPE_IDS,
    DTYPES,
    LAYOUTS,
    SIZE_PATTERNS,
    assert_close,
    assert_same,
    layout,
    make,
    reference,
)
from test_all_gather import shards
from test_reductions import OPS, block, stack_for, unsupported

import hpccoll
from hpccoll.transports.cuda_mpi import cuda_aware

try:
    import cupy

    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, no driver, no GPU
    cupy, GPUS = None, 0

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.skipif(GPUS < 1, reason="needs CuPy and a CUDA GPU")]

TRANSPORTS = ["nccl", "staged", "cuda_mpi"]


def _bf16_supported() -> bool:
    try:
        a = cupy.asarray(np.ones(2, [d for d in DTYPES if d.name == "bfloat16"][0]))
        return bool((a.astype(np.float32) == 1).all())
    except Exception:
        return False


def _nccl_shares_gpus() -> bool:
    """NCCL's multi-rank mode: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (ranks may share a GPU)."""
    try:
        from cupy.cuda import nccl

        return os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and nccl.get_version() >= 23000
    except Exception:  # no NCCL binding
        return False


if GPUS:
    from hpccoll._local import local_rank

    cupy.cuda.Device(local_rank()[0] % GPUS).use()
    BF16 = _bf16_supported()
else:
    BF16 = False
SHARED = bool(GPUS) and _nccl_shares_gpus()


def nccl_fits(comm) -> bool:
    """Whether NCCL can run on ``comm``: one GPU per rank, or NCCL's multi-rank mode."""
    return comm.size <= GPUS or SHARED


def up(a):
    return cupy.asarray(a)


def on_device(a, how):
    """``a``'s values on the GPU in a memory layout: C, Fortran, strided or reversed (device strides)."""
    return layout(up(np.ascontiguousarray(a)), how, cupy)


def down(a):
    assert isinstance(a, cupy.ndarray), type(a)
    return cupy.asnumpy(a)


def skip_unsupported_dtype(dtype):
    if dtype.name == "bfloat16" and not BF16:
        pytest.skip("this CuPy has no bfloat16 arrays")  # the same on every rank


@pytest.fixture(params=TRANSPORTS)
def tcomm(request, comm):
    """A Communicator asking for one GPU transport by name."""
    name = request.param
    if name == "cuda_mpi" and not cuda_aware(comm).aware:
        pytest.skip(f"MPI is not known to be CUDA-aware ({cuda_aware(comm).source})")  # the same on every rank
    if name == "nccl" and not nccl_fits(comm):
        pytest.skip("NCCL needs one GPU per rank (test_nccl_refuses_shared_gpu covers this size)")
    c = hpccoll.Communicator(comm.mpi, transport=name)
    yield c
    c.free()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_every_dtype_and_op(tcomm, dtype, op):
    skip_unsupported_dtype(dtype)
    stack, x = stack_for(tcomm, (2 * tcomm.size + 1, 3), dtype, seed=11)
    if unsupported(dtype, op):
        with pytest.raises(hpccoll.DTypeError, match="op="):
            hpccoll.all_reduce(up(x), tcomm, op=op)
        return
    d = up(x)
    scattered = hpccoll.reduce_scatter(d, tcomm, op=op)
    reduced = hpccoll.all_reduce(d, tcomm, op=op)
    y = up(x)
    hpccoll.all_reduce(y, tcomm, op=op, out=y)
    want = reference(stack, op)
    sizes = hpccoll.split_sizes(x.shape[0], tcomm.size)
    assert_close(down(scattered), block(want, 0, sizes, tcomm.rank))
    assert_close(down(reduced), want)
    assert_close(down(y), want)
    assert_same(down(d), x)  # the input is untouched


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_every_dtype_uneven_axis1(tcomm, dtype):
    skip_unsupported_dtype(dtype)
    sizes = SIZE_PATTERNS["uneven"](tcomm.size)
    x, full = shards(tcomm, (2, 0, 3), 1, sizes, dtype)
    gathered = hpccoll.all_gather(up(x), tcomm, axis=1)
    adjoint = hpccoll.all_gather_adjoint(up(full), tcomm, axis=1, sizes=sizes)  # a reduce-scatter
    assert_same(down(gathered), full)
    want = block(reference(np.stack([full] * tcomm.size), "sum"), 1, sizes, tcomm.rank)
    assert_close(down(adjoint), want)


@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("shape,axis", [((4, 0), 1), ((2, 0, 3), 1), ((2, 3, 0), -1), ((0, 3), 0)])
@pytest.mark.parametrize("how", LAYOUTS)
def test_axes_layouts_uneven(tcomm, shape, axis, pattern, how):
    sizes = SIZE_PATTERNS[pattern](tcomm.size)
    x, full = shards(tcomm, shape, axis % len(shape), sizes, np.float64, seed=3)
    shape = list(shape)
    shape[axis] = sum(sizes)
    stack, z = stack_for(tcomm, tuple(shape), np.float32, seed=4)
    gathered = hpccoll.all_gather(on_device(x, how), tcomm, axis=axis, sizes=sizes)
    out = on_device(np.zeros_like(block(stack[0], axis % len(shape), sizes, tcomm.rank)), how)
    scattered = hpccoll.reduce_scatter(on_device(z, how), tcomm, axis=axis, sizes=sizes, out=out)
    assert_same(down(gathered), full)
    assert scattered is out
    assert_close(down(out), block(reference(stack, "sum"), axis % len(shape), sizes, tcomm.rank))


@pytest.mark.parametrize("uneven", ["grouped", "pad"])
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("complex128", "prod"), ("int16", "sum"), ("bool", "max")])
def test_primitives_directly(tcomm, dtype, op, uneven):
    """The transport's own primitives on flat device buffers: NCCL runs even at one rank."""
    if tcomm.transport != "nccl" and uneven == "pad":
        pytest.skip("only NCCL has uneven-shard designs")  # the same on every rank
    t = tcomm.transport_instance(tcomm.transport)
    if tcomm.transport == "nccl":
        t.uneven = uneven
    dtype = np.dtype(dtype)
    counts = [r % 3 + 1 for r in range(tcomm.size)]
    start, mine = sum(counts[: tcomm.rank]), counts[tcomm.rank]
    full = make((sum(counts),), dtype, seed=5)
    recv = cupy.empty(sum(counts), dtype)
    t.allgatherv(up(full[start : start + mine]), recv, counts)
    stack = make((tcomm.size, sum(counts)), dtype, seed=6)
    if dtype == np.bool_:
        stack = stack.view(np.uint8)  # transports reduce bool as uint8 (the API's plan)
    part = cupy.empty(mine, stack.dtype)
    t.reduce_scatter(up(stack[tcomm.rank]), part, counts, op)
    whole = up(stack[tcomm.rank])
    t.allreduce(None, whole, op)
    cupy.cuda.get_current_stream().synchronize()
    assert_same(down(recv), full)
    want = reference(stack, op)
    assert_close(down(part), want[start : start + mine])
    assert_close(down(whole), want)


def test_runs_on_the_callers_stream(tcomm):
    stack, x = stack_for(tcomm, (1 << 16,), np.float32, seed=7)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        d = up(x)
        y = hpccoll.all_reduce(d * 2, tcomm)
        z = hpccoll.all_gather(d[:8], tcomm)
    stream.synchronize()
    assert_close(down(y), reference(stack * 2, "sum"))
    assert_same(down(z), stack[:, :8].reshape(-1))


def test_dot_test_on_device(tcomm):
    from hpccoll.testing import dottest

    sizes = SIZE_PATTERNS["uneven"](tcomm.size)
    op = hpccoll.AllGather(tcomm, axis=1, sizes=sizes)
    x = up(make((3, sizes[tcomm.rank]), np.float64, seed=10 + tcomm.rank))
    y = up(make((3, sum(sizes)), np.float64, seed=20 + tcomm.rank))
    assert dottest(op, x, y)


def test_transport_for_and_split(comm):
    c = hpccoll.Communicator(comm.mpi)
    try:
        x = cupy.ones(3)
        choice = c.transport_for(x)
        sub = c.split(comm.rank)  # one rank each: NCCL is always usable there
        sub_choice = sub.transport_for(x)
        got = hpccoll.all_reduce(x, sub)
        sub_nccl = sub.transport_instance("nccl")
        sub_nccl.allreduce(None, got, "sum")
        sub.free()
        if nccl_fits(comm):
            assert choice.name == "nccl", choice
        else:
            assert choice.name in ("staged", "cuda_mpi") and "share one GPU" in choice.reason, choice
        assert sub_choice.name == "nccl"
        assert_same(down(got), np.ones(3))
    finally:
        c.free()


@pytest.mark.mpi(min_size=2)
def test_nccl_refuses_shared_gpu(comm):
    if nccl_fits(comm):
        pytest.skip("enough GPUs for one rank each, or NCCL's multi-rank mode")  # the same on every rank
    c = hpccoll.Communicator(comm.mpi, transport="nccl")
    try:
        with pytest.raises(hpccoll.TransportUnavailable, match="share one GPU"):
            hpccoll.all_reduce(cupy.ones(2), c)
    finally:
        c.free()


# --------------------------------------------------------------------------- issue 12 (not yet run on a GPU)


RELAYOUT_SIZES = {"even": (3, 3, 3), "uneven": (2, 0, 5, 1), "leading-zeros": (0, 0, 4), "many": (1, 3, 0, 2, 5, 1)}


def _device_at(host, offset_items):
    """``host`` copied to the GPU at ``offset_items`` elements into a larger allocation (a narrower alignment)."""
    base = cupy.zeros(host.size + offset_items, host.dtype)
    view = base[offset_items:]
    view[...] = up(np.ascontiguousarray(host).reshape(-1))
    return view.reshape(host.shape)


@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("pattern", sorted(RELAYOUT_SIZES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_relayout_kernel_matches_numpy(dtype, pattern, offset):
    """``copy_blocks`` on CuPy (one kernel launch) is bit-identical to NumPy's, both ways, every axis."""
    from hpccoll._relayout import copy_blocks

    skip_unsupported_dtype(dtype)
    sizes = RELAYOUT_SIZES[pattern]
    for ax, shape in enumerate([(sum(sizes), 7, 3), (5, sum(sizes), 6), (4, 3, sum(sizes))]):
        host = make(shape, dtype, seed=ax + offset)
        want = np.empty(host.size, host.dtype)
        copy_blocks(want, host, np, ax, sizes, True)
        arr = _device_at(host, offset)
        buf = cupy.empty(host.size + offset, host.dtype)[offset:]
        copy_blocks(buf, arr, cupy, ax, sizes, True)
        back = _device_at(np.zeros_like(host), offset)
        copy_blocks(buf, back, cupy, ax, sizes, False)
        cupy.cuda.get_current_stream().synchronize()
        assert_same(down(buf), want)
        assert_same(down(back), host)


@pytest.mark.parametrize("how", ["F", "strided", "reversed"])
@pytest.mark.parametrize("pattern", ["even", "uneven"])
def test_relayout_kernel_other_layouts_and_widening(how, pattern):
    from hpccoll._relayout import copy_blocks

    sizes = RELAYOUT_SIZES[pattern]
    host = make((4, sum(sizes), 3), np.float16, seed=1, kind="exact")
    want = np.empty(host.size, np.float32)
    copy_blocks(want, host, np, 1, sizes, True)
    arr = on_device(host, how)
    wide = cupy.empty(host.size, cupy.float32)
    copy_blocks(wide, arr, cupy, 1, sizes, True)  # reduce-scatter's packing with the float16 -> float32 widening
    same = cupy.empty(host.size, cupy.float16)
    copy_blocks(same, arr, cupy, 1, sizes, True)
    back = on_device(np.zeros_like(host), how)
    copy_blocks(same, back, cupy, 1, sizes, False)
    assert_same(down(wide), want)
    assert_same(down(same), want.astype(np.float16))
    assert_same(down(back), host)


def test_relayout_large_even_and_uneven():
    """64 MiB along axis 1, even and uneven (the bandwidth case of bench_gpu's relayout rows)."""
    from hpccoll._relayout import copy_blocks

    for sizes in [(16, 16, 16, 16), (8, 24, 16, 16)]:
        arr = cupy.random.default_rng(0).random((64, 64, 1 << 12), dtype=cupy.float32)
        buf = cupy.empty(arr.size, arr.dtype)
        copy_blocks(buf, arr, cupy, 1, sizes, True)
        want = cupy.concatenate([b.reshape(-1) for b in cupy.split(arr, np.cumsum(sizes)[:-1].tolist(), axis=1)])
        back = cupy.empty_like(arr)
        copy_blocks(buf, back, cupy, 1, sizes, False)
        assert bool((buf == want).all()) and bool((back == arr).all())


def _solo_nccl(comm):
    """A one-rank Communicator per rank (NCCL always usable there) and its nccl transport."""
    solo = hpccoll.Communicator(comm.mpi).split(comm.rank)
    return solo, solo.transport_instance("nccl")


def test_cuda_graph_capture_and_replay_nccl(comm):
    """all_gather, reduce_scatter and all_reduce over nccl (one rank), captured once and replayed."""
    solo, t = _solo_nccl(comm)
    try:
        n = 1 << 12
        x = cupy.empty(n, cupy.float32)
        g, r, y = cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32)
        api_g, api_r, api_y = cupy.empty((2, n // 2), cupy.float32), cupy.empty(n, cupy.float32), cupy.empty_like(x)
        api_g2 = cupy.empty((2, n // 2), cupy.float32)  # (one rank: the API copies, which captures too)
        stream = cupy.cuda.Stream(non_blocking=True)

        def collectives():
            t.allgatherv(x, g, [n])  # the transport: NCCL calls at one rank
            t.reduce_scatter(x, r, [n], "sum")
            t.allreduce(x, y, "sum")
            hpccoll.all_gather(x.reshape(2, -1), solo, axis=1, sizes=[n // 2], out=api_g)  # the public API
            hpccoll.reduce_scatter(x, solo, out=api_r)
            hpccoll.all_reduce(x, solo, out=api_y)
            hpccoll.all_gather(x.reshape(2, -1), solo, sizes=[2], out=api_g2)

        with stream:
            x[...] = 1
            collectives()  # warm-up outside the capture: NCCL connects, kernels compile
            stream.synchronize()
            stream.begin_capture()
            collectives()
            graph = stream.end_capture()
            seen = []
            for k in range(3):
                x[...] = cupy.arange(n, dtype=cupy.float32) * (k + 2)
                graph.launch(stream)
                stream.synchronize()
                seen.append([down(a) for a in (x, g, r, y, api_g, api_r, api_y, api_g2)])
        for values in seen:
            want = values[0]
            for got in values[1:]:
                np.testing.assert_array_equal(got.reshape(-1), want)
    finally:
        solo.free()


def test_cuda_graph_capture_world_nccl(comm):
    """The world's collectives (``out=`` and ``sizes`` given) captured and replayed, with one GPU per rank."""
    if not nccl_fits(comm):
        pytest.skip("needs one GPU per rank or NCCL's multi-rank mode")  # the same on every rank
    c = hpccoll.Communicator(comm.mpi, transport="nccl")
    try:
        n, P = 1 << 10, comm.size
        x, big = cupy.empty(n, cupy.float32), cupy.empty(n * P, cupy.float32)
        g, r, y = cupy.empty(n * P, cupy.float32), cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32)
        stream = cupy.cuda.Stream(non_blocking=True)

        def collectives():
            hpccoll.all_gather(x, c, sizes=[n] * P, out=g)
            hpccoll.reduce_scatter(big, c, out=r)
            hpccoll.all_reduce(x, c, out=y)

        with stream:
            x[...] = comm.rank + 1
            big[...] = comm.rank + 1
            collectives()  # warm-up outside the capture
            stream.synchronize()
            stream.begin_capture()
            collectives()
            graph = stream.end_capture()
            x[...] = 10 * (comm.rank + 1)
            big[...] = 10 * (comm.rank + 1)
            graph.launch(stream)
            stream.synchronize()
        total = 10 * P * (P + 1) / 2
        np.testing.assert_array_equal(down(g), np.repeat(10.0 * np.arange(1, P + 1), n).astype(np.float32))
        np.testing.assert_array_equal(down(r), np.full(n, total, np.float32))
        np.testing.assert_array_equal(down(y), np.full(n, total, np.float32))
    finally:
        c.free()


@pytest.mark.parametrize("name", ["staged", "cuda_mpi"])
def test_synchronising_transports_refuse_capture(comm, name):
    """staged and cuda_mpi wait on the host for the stream: under capture they raise, before any MPI call."""
    if name == "cuda_mpi" and not cuda_aware(comm).aware:
        pytest.skip(f"MPI is not known to be CUDA-aware ({cuda_aware(comm).source})")
    c = hpccoll.Communicator(comm.mpi, transport=name)
    try:
        t = c.transport_instance(name)
        x, y = cupy.ones(16, cupy.float32), cupy.empty(16, cupy.float32)
        t.allreduce(x, y, "sum")  # outside capture: fine (pinned buffers made)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                with pytest.raises(
                    hpccoll.TransportUnavailable, match=f"transport '{name}' cannot run during CUDA stream capture"
                ):
                    t.allreduce(x, y, "sum")
            finally:
                try:
                    stream.end_capture()
                except Exception:  # the capture was invalidated by CUDA's refusal
                    pass
        t.allreduce(x, y, "sum")  # usable again afterwards
        cupy.cuda.get_current_stream().synchronize()
        np.testing.assert_array_equal(down(y), np.full(16, comm.size, np.float32))
    finally:
        c.free()


# --------------------------------------------------------------------------- plans, rooted, halo (issue 43)


def test_plans_against_numpy(tcomm):
    """Plans of all_gather (uneven, axis 1), reduce_scatter and all_reduce (in place) on device buffers."""
    P, me = tcomm.size, tcomm.rank
    sizes = [r % 3 + 1 for r in range(P)]
    stack = [np.arange(4.0 * s).reshape(4, s) + 100 * r for r, s in enumerate(sizes)]
    full = np.arange(3.0 * sum(sizes)).reshape(sum(sizes), 3)
    x, f, y = up(stack[me]), up(full + me), up(full + me)
    got = []
    gather = hpccoll.plan(hpccoll.all_gather, x, tcomm, axis=1, sizes=sizes)
    scatter = hpccoll.plan(hpccoll.reduce_scatter, f, tcomm, sizes=sizes)
    inplace = hpccoll.plan(hpccoll.all_reduce, y, tcomm, out=y)
    with gather, scatter, inplace:
        for k in (1, 2):  # each run reads its buffers' current contents
            x[...] = up(stack[me] * k)
            f[...] = up((full + me) * k)
            y[...] = up((full + me) * k)
            got.append([down(gather()), down(scatter()), down(inplace())])
    total = P * full + P * (P - 1) / 2
    lo = sum(sizes[:me])
    for k, (g, r, a) in zip((1, 2), got):
        assert_same(g, np.concatenate(stack, axis=1) * k, tcomm)
        assert_same(r, total[lo : lo + sizes[me]] * k, tcomm)
        assert_same(a, total * k, tcomm)


def test_rooted_collectives_every_root(tcomm):
    """broadcast, reduce, gather and scatter (uneven, an empty shard where P >= 3) on device arrays, every root."""
    P, me = tcomm.size, tcomm.rank
    rng = np.random.default_rng(5)
    stack = rng.standard_normal((P, 4, 3))
    ints = rng.integers(-50, 50, (P, 5)).astype(np.int32)
    sizes = [(q + 1) % 3 for q in range(P)]
    whole = rng.standard_normal((sum(sizes), 2))
    own = whole[sum(sizes[:me]) : sum(sizes[: me + 1])]
    got, want = [], []
    for root in range(P):
        mine = root == me
        got.append(hpccoll.broadcast(up(stack[me]), tcomm, root=root))
        want.append(stack[root])
        got.append(hpccoll.reduce(up(ints[me]), tcomm, root=root))
        want.append(ints.sum(0, dtype=np.int32) if mine else np.zeros(5, np.int32))
        got.append(hpccoll.gather(up(own), tcomm, root=root))
        want.append(whole if mine else whole[:0])
        got.append(hpccoll.scatter(up(whole if mine else whole[:0]), tcomm, root=root, sizes=sizes))
        want.append(own)
    for g, w in zip(got, want):
        assert_same(down(g), w, tcomm)


def test_halo_exchange_against_host_mpi(tcomm):
    """halo_exchange and its adjoint on device arrays (contiguous and strided faces, planned in place) against
    the same exchange of NumPy arrays over host MPI."""
    grid = tcomm.cartesian([tcomm.size], periodic=True)
    host = hpccoll.Communicator(tcomm.mpi, transport="mpi").cartesian([tcomm.size], periodic=True)
    try:
        rng = np.random.default_rng(tcomm.rank)
        x, g = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
        got = [
            down(hpccoll.halo_exchange(up(x), grid, halo=2)),
            down(hpccoll.halo_exchange(up(x.T.copy()).T, grid, halo=2)),  # strided faces
            down(hpccoll.halo_exchange_adjoint(up(g), grid, halo=2)),
        ]
        inplace = up(x)
        with hpccoll.plan(hpccoll.halo_exchange, inplace, grid, halo=2, out=inplace) as planned:
            got.append(down(planned()))
        exchanged = hpccoll.halo_exchange(x, host, halo=2)
        want = [exchanged, exchanged, hpccoll.halo_exchange_adjoint(g, host, halo=2), exchanged]
        for a, b in zip(got, want):
            assert_same(np.ascontiguousarray(a), np.ascontiguousarray(b), tcomm)
    finally:
        grid.free()
        host.free()


def test_shift_against_numpy(tcomm):
    """shift and its adjoint on device arrays: one array, a list, in place, async and planned, against NumPy."""
    P, r = tcomm.size, tcomm.rank
    G = np.arange(P * 12, dtype=np.float32).reshape(P, 3, 4)
    H = (np.arange(P * 5) + 1j).astype(np.complex64).reshape(P, 5)
    got = [
        down(hpccoll.shift(up(G[r]), tcomm, offset=1)),
        down(hpccoll.shift_adjoint(up(G[r]), tcomm, offset=2)),
        *[down(a) for a in hpccoll.shift([up(G[r]), up(H[r])], tcomm, offset=-1, async_op=True).wait()],
    ]
    want = [G[(r - 1) % P], G[(r + 2) % P], G[(r + 1) % P], H[(r + 1) % P]]
    x = up(G[r])
    hpccoll.shift(x, tcomm, out=x)
    got.append(down(x))
    want.append(G[(r - 1) % P])
    src, out = up(G[r]), up(np.zeros_like(G[r]))
    with hpccoll.plan(hpccoll.shift, src, tcomm, out=out) as planned:
        got.append(down(planned()))
    want.append(G[(r - 1) % P])
    for a, b in zip(got, want):
        assert_same(a, b, tcomm)


def test_cuda_graph_capture_of_plans_nccl(comm):
    """Plans over nccl captured in a CUDA graph once and replayed with new inputs (on the world where NCCL
    fits it, else on one rank each)."""
    world = hpccoll.Communicator(comm.mpi, transport="nccl")
    c = world if nccl_fits(comm) else world.split(comm.rank)
    try:
        P, n = c.size, 1 << 10
        x, big = cupy.zeros(n, cupy.float32), cupy.zeros(n * P, cupy.float32)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            plans = [
                hpccoll.plan(hpccoll.all_gather, x, c, sizes=[n] * P),
                hpccoll.plan(hpccoll.reduce_scatter, big, c),
                hpccoll.plan(hpccoll.all_reduce, x, c),
            ]
            outs = [p() for p in plans]  # warm-up outside the capture: NCCL connects, kernels compile
            stream.synchronize()
            stream.begin_capture()
            outs = [p() for p in plans]
            graph = stream.end_capture()
            seen = []
            for k in (2, 3):
                x[...] = k * (c.rank + 1)
                big[...] = k * (c.rank + 1)
                graph.launch(stream)
                stream.synchronize()
                seen.append([down(o) for o in outs])
            for p in plans:
                p.free()
        for k, (g, r, a) in zip((2, 3), seen):
            total = k * P * (P + 1) / 2
            assert_same(g, np.repeat(k * np.arange(1.0, P + 1), n).astype(np.float32), c)
            assert_same(r, np.full(n, total, np.float32), c)
            assert_same(a, np.full(n, total, np.float32), c)
    finally:
        if c is not world:
            c.free()
        world.free()
