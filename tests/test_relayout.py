"""The block relayout (``hpccoll._relayout.copy_blocks``) against a slicing reference.

Local (no communication): every test here runs in the serial pass and is
skipped at more than one rank. The NumPy path is tested for every dtype,
even and uneven blocks (zeros included), every axis, non-contiguous and
unaligned arrays, both directions, bit for bit. The CuPy path's kernel is
compiled from its CUDA source as C++ for the CPU (with a host harness that
runs the thread blocks one after another) and driven through the CuPy code
path with a NumPy-backed stand-in for the array module: its indexing,
tables, element widths and 64-bit indices run here; on a GPU,
``tests/test_gpu.py`` runs the real kernel (not yet run on hardware).
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import types

import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, LAYOUTS, layout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import hpccoll
import hpccoll._relayout as relayout
from hpccoll._relayout import copy_blocks, element_width

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.Get_size() > 1, reason="local (no communication): runs in the serial pass"
)

#: Block extents along the axis, for the parametrized tests.
PATTERNS = {
    "even": (2, 2, 2),
    "uneven": (2, 0, 3, 1),
    "leading-zeros": (0, 0, 5),
    "trailing-zeros": (3, 1, 0, 0),
    "one-block": (4,),
    "many": (1, 3, 0, 2, 5, 1, 0, 4, 2),
}
#: Array shapes with the split axis marked None.
SHAPES = [(None,), (3, None), (None, 4), (2, None, 3), (2, 3, None, 2), (3, None, 1, 5)]


def random_array(shape, dtype, seed=0):
    """``shape`` of ``dtype`` from random bytes (NaN payloads included); bool as 0/1."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def reference_flat(arr, ax, sizes):
    """The blocks of ``arr`` along ``ax``, each in C order, one after another."""
    bounds = np.cumsum([0, *sizes])
    pieces = [np.ascontiguousarray(np.take(arr, range(a, b), axis=ax)).reshape(-1) for a, b in zip(bounds, bounds[1:])]
    return np.concatenate(pieces) if pieces else np.empty(0, arr.dtype)


def reference_grid(flat, shape, ax, sizes):
    """``flat``'s blocks put back along ``ax`` of an array of ``shape``."""
    pieces, off = [], 0
    for s in sizes:
        block = shape[:ax] + (s,) + shape[ax + 1 :]
        count = int(np.prod(block))
        pieces.append(flat[off : off + count].reshape(block))
        off += count
    return np.concatenate(pieces, axis=ax)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def roundtrip(arr, ax, sizes, xp=np, make=np.empty):
    """Pack ``arr`` with copy_blocks, check, unpack into a fresh array laid out like ``arr``, check."""
    want = reference_flat(arr, ax, sizes)
    buf = make(arr.size, arr.dtype)
    copy_blocks(buf, arr, xp, ax, tuple(sizes), True)
    same_bits(buf, want)
    out = np.zeros_like(arr)  # same layout as arr (C, F or other strides)
    copy_blocks(want.copy(), out, xp, ax, list(sizes), False)
    same_bits(out, arr)


def shape_with(template, n):
    return tuple(n if d is None else d for d in template)


# --------------------------------------------------------------------------- NumPy


@pytest.mark.parametrize("template", SHAPES, ids=str)
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_dtype_pattern_and_axis(dtype, pattern, template):
    sizes = PATTERNS[pattern]
    shape = shape_with(template, sum(sizes))
    roundtrip(random_array(shape, dtype, seed=len(shape)), template.index(None), sizes)


@pytest.mark.parametrize("how", LAYOUTS + ["transposed"])
@pytest.mark.parametrize("pattern", ["even", "uneven", "many"])
@pytest.mark.parametrize("ax", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["bool", "float32", "complex128"])
def test_non_contiguous(dtype, ax, pattern, how):
    sizes = PATTERNS[pattern]
    shape = [3, 4, 2]
    shape[ax] = sum(sizes)
    arr = random_array(tuple(shape), dtype, seed=ax)
    if how == "transposed":  # a transposed view of an array of the transposed shape
        arr = np.ascontiguousarray(arr.transpose(2, 0, 1)).transpose(1, 2, 0)
    else:
        arr = layout(arr, how)
    roundtrip(arr, ax, sizes)


@pytest.mark.parametrize("offset", range(1, 16, 3))
@pytest.mark.parametrize("pattern", ["even", "uneven"])
@pytest.mark.parametrize("dtype,trail", [("float32", 4), ("float64", 2), ("int16", 3), ("complex64", 1)])
def test_odd_alignments(dtype, trail, pattern, offset):
    """Arrays and buffers that start at odd byte offsets (unaligned NumPy views)."""
    sizes = PATTERNS[pattern]
    dtype = np.dtype(dtype)
    shape = (33, sum(sizes), trail)  # 33 rows: enough runs for the one-element-per-run views
    count = int(np.prod(shape))

    def unaligned(n, dt, at):
        raw = np.zeros(n * dt.itemsize + 32, np.uint8)
        return np.frombuffer(raw, dt, count=n, offset=at)

    arr = unaligned(count, dtype, offset).reshape(shape)
    arr[...] = random_array(shape, dtype, seed=offset)
    roundtrip(arr, 1, sizes, make=lambda n, dt: unaligned(n, np.dtype(dt), 16 - offset))


@pytest.mark.parametrize("run_bytes", [4, 8, 12, 16, 24, 64, 4096, 8192, 65536])
@pytest.mark.parametrize("rows", [1, 2, 40])
def test_runs_short_and_long(run_bytes, rows):
    """One element per run, short runs and long, few rows and many."""
    trail = run_bytes // 4
    for sizes in [(1, 1, 1), (1, 0, 2)]:
        roundtrip(random_array((rows, sum(sizes), trail), np.float32, seed=run_bytes), 1, sizes)


@pytest.mark.parametrize("how", ["C", "F"])
@pytest.mark.parametrize("pattern", ["even", "uneven"])
@pytest.mark.parametrize("src,wire", [("float16", "float32"), ("bfloat16", "float32"), ("int16", "int64")])
def test_converting_pack(src, wire, pattern, how):
    """A buffer of another dtype (reduce-scatter's 16-bit float widening): values are converted."""
    src = [d for d in DTYPES if d.name == src][0]
    sizes = PATTERNS[pattern]
    arr = layout((np.random.default_rng(1).integers(-8, 8, size=(2, sum(sizes), 3)) / 4).astype(src), how)
    buf = np.empty(arr.size, wire)
    copy_blocks(buf, arr, np, 1, sizes, True)
    np.testing.assert_array_equal(buf, reference_flat(arr, 1, sizes).astype(wire))
    back = np.zeros_like(arr)
    copy_blocks(buf, back, np, 1, sizes, False)
    same_bits(back, arr)


def test_empty_arrays_are_left_alone():
    for shape, ax, sizes in [((0, 3), 1, (1, 2)), ((2, 0), 1, (0, 0)), ((2, 3, 0), 1, (1, 2))]:
        arr = np.empty(shape, np.float32)
        copy_blocks(np.empty(0, np.float32), arr, np, ax, sizes, True)
        copy_blocks(np.empty(0, np.float32), arr, np, ax, sizes, False)


def test_sizes_as_any_sequence():
    arr = random_array((3, 5, 2), np.int32)
    buf = np.empty(arr.size, arr.dtype)
    copy_blocks(buf, arr, np, 1, np.array([2, 0, 3]), True)
    same_bits(buf, reference_flat(arr, 1, (2, 0, 3)))


def test_element_width():
    assert element_width(48) == 16 and element_width(24) == 8 and element_width(6) == 2 and element_width(3) == 1
    assert element_width(64, 0x1000, 0x2008) == 8
    assert element_width(64, 0x1001) == 1
    assert element_width(0) == 16


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_property_any_layout(data):
    ndim = data.draw(st.integers(1, 4))
    ax = data.draw(st.integers(0, ndim - 1))
    sizes = tuple(data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=6)))
    shape = tuple(sum(sizes) if d == ax else data.draw(st.integers(0 if ndim > 1 else 1, 4)) for d in range(ndim))
    dtype = data.draw(st.sampled_from(DTYPES))
    how = data.draw(st.sampled_from(LAYOUTS))
    roundtrip(layout(random_array(shape, dtype, seed=ndim), how), ax, sizes)


# --------------------------------------------------------------------------- the CuPy path, on the CPU

_HARNESS = r"""
#define __global__
#define __device__
#define __forceinline__ inline
struct hpccoll_dim3 { unsigned int x, y, z; };
static hpccoll_dim3 blockIdx, threadIdx, blockDim;
KERNEL
extern "C" void hpccoll_launch(void* flat, void* grid, const void* table, int parts, long long even,
                               long long lead, long long row, long long total, int to_flat,
                               unsigned tiles, unsigned threads) {
    blockDim.x = threads;  // every thread block, every thread, one after another
    for (unsigned b = 0; b < tiles; ++b) {
        blockIdx.x = b;
        for (unsigned t = 0; t < threads; ++t) {
            threadIdx.x = t;
            hpccoll_copy_blocks((unit_t*)flat, (unit_t*)grid, (const index_t*)table, parts, (index_t)even,
                                (index_t)lead, (index_t)row, (index_t)total, to_flat);
        }
    }
}
"""


class DeviceArray(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr`` / ``.data.device_id`` (what the CuPy path reads)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data, device_id=0)


class HarnessKernel:
    """``cupy.RawKernel`` stand-in: the CUDA source compiled as C++ and run on the host."""

    launches = []

    def __init__(self, code, name, build_dir):
        assert name == "hpccoll_copy_blocks"
        self.code = code
        source = _HARNESS.replace("KERNEL", code)
        digest = hashlib.sha1(source.encode()).hexdigest()[:16]
        lib = build_dir / f"relayout_{digest}.so"
        if not lib.exists():
            src = build_dir / f"relayout_{digest}.cpp"
            src.write_text(source)
            subprocess.run(
                ["c++", "-std=c++14", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(lib), str(src)],
                check=True,
                capture_output=True,
            )
        self.fn = ctypes.CDLL(str(lib)).hpccoll_launch
        self.fn.restype = None
        self.fn.argtypes = (
            [ctypes.c_void_p] * 3
            + [ctypes.c_int]
            + [ctypes.c_longlong] * 4
            + [ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
        )

    def __call__(self, grid, block, args):
        flat, arr, table, parts, even, lead, row, total, to_flat = args
        assert isinstance(flat, DeviceArray) and isinstance(arr, DeviceArray)
        assert isinstance(parts, np.int32) and isinstance(to_flat, np.int32)
        assert type(even) is type(lead) is type(row) is type(total)
        if even:  # even blocks: a null table (found by arithmetic); uneven: the table, of the index type
            assert type(table) is np.uint64 and table == 0
            address = 0
        else:
            assert isinstance(table, DeviceArray) and table.dtype == row.dtype
            address = table.ctypes.data
        HarnessKernel.launches.append((self.code, int(grid[0]), row.dtype, bool(even)))
        self.fn(
            flat.ctypes.data,
            arr.ctypes.data,
            address,
            int(parts),
            int(even),
            int(lead),
            int(row),
            int(total),
            int(to_flat),
            grid[0],
            block[0],
        )


class Stream:
    """The current stream, as far as the relayout asks: whether it is capturing."""

    capturing = False

    def is_capturing(self):
        if isinstance(self.capturing, Exception):
            raise self.capturing
        return self.capturing


def _fake_cupy(build_dir):
    """The array-module calls the CuPy path makes, on NumPy arrays seen as DeviceArray."""

    def dev(a):
        return a.view(DeviceArray)

    stream = Stream()
    return types.SimpleNamespace(
        __name__="cupy (host stand-in)",
        cuda=types.SimpleNamespace(get_current_stream=lambda: stream),
        RawKernel=lambda code, name: HarnessKernel(code, name, build_dir),
        asarray=lambda a: dev(np.asarray(a)),
        empty=lambda shape, dtype: dev(np.empty(shape, dtype)),
        ascontiguousarray=lambda a, dtype=None: dev(np.ascontiguousarray(a, dtype=dtype)),
        copyto=np.copyto,
        moveaxis=np.moveaxis,
    )


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the relayout kernel's host build needs one")
    return tmp_path_factory.mktemp("relayout-kernel")


@pytest.fixture
def host_cupy(build_dir, monkeypatch):
    """The CuPy path with the kernel compiled for the host; fresh kernel and table caches."""
    monkeypatch.setattr(relayout, "_KERNELS", {})
    monkeypatch.setattr(relayout, "_TABLES", {})
    HarnessKernel.launches = []
    return _fake_cupy(build_dir)


def guarded(n, dtype, offset=0):
    """A DeviceArray of ``n`` elements at byte ``offset`` inside a buffer whose margins are checked."""
    dtype = np.dtype(dtype)
    raw = np.full(n * dtype.itemsize + 96, 0xA5, np.uint8)
    start = 32 + offset
    arr = np.frombuffer(raw, dtype, count=n, offset=start).view(DeviceArray)
    return arr, lambda: (raw[:start] == 0xA5).all() and (raw[start + n * dtype.itemsize :] == 0xA5).all()


def device_roundtrip(xp, arr_host, ax, sizes, offsets=(0, 0)):
    """copy_blocks through the CuPy path both ways (guarded buffers); returns the launches made."""
    want = reference_flat(arr_host, ax, sizes)
    arr, arr_ok = guarded(arr_host.size, arr_host.dtype, offsets[0])
    arr[...] = arr_host.reshape(-1)
    arr = arr.reshape(arr_host.shape)
    buf, buf_ok = guarded(arr_host.size, arr_host.dtype, offsets[1])
    copy_blocks(buf, arr, xp, ax, sizes, True)
    same_bits(np.asarray(buf), want)
    out, out_ok = guarded(arr_host.size, arr_host.dtype, offsets[0])
    out = out.reshape(arr_host.shape)
    copy_blocks(buf, out, xp, ax, sizes, False)
    same_bits(np.asarray(out), arr_host)
    assert arr_ok() and buf_ok() and out_ok(), "the kernel wrote outside its buffers"


@pytest.mark.parametrize("wide_index", [False, True], ids=["int32", "int64"])
@pytest.mark.parametrize(
    "lead,sizes,trail,dtype,width",
    [
        (3, (2, 2, 2), 1, "float32", 8),  # runs of 8 bytes
        (3, (4, 4), 1, "float32", 16),
        (5, (1, 0, 3, 2), 2, "float32", 8),
        (4, (1, 1, 1), 3, "float32", 4),  # runs of 12 bytes
        (7, (3, 2), 1, "int16", 2),
        (6, (1, 2, 0), 1, "int8", 1),
        (2, (0, 0, 701, 0, 300), 1, "float64", 8),  # rows longer than a thread block: stepping without dividing
        (300, (3, 1, 2, 0, 2), 1, "complex128", 16),  # many short rows: a tile crosses rows and blocks
        (9, tuple(range(13)), 2, "complex64", 16),  # 13 blocks: the binary search
        (1, (3, 5), 4, "float32", 16),  # one row: a plain copy
        (300, (4, 4, 4), 1, "float32", 16),  # even, many short rows: tiles cross rows and blocks
        (2, (700, 700), 1, "float64", 16),  # even, rows longer than a thread block
        (37, (5, 5, 5, 5), 3, "int16", 2),
    ],
)
@pytest.mark.parametrize("threads", [256, 32])
def test_kernel_on_the_host(host_cupy, monkeypatch, lead, sizes, trail, dtype, width, wide_index, threads):
    monkeypatch.setattr(relayout, "THREADS", threads)  # 32: each thread steps more often
    if wide_index:
        monkeypatch.setattr(relayout, "INDEX32_LIMIT", 0)  # 64-bit indices, as past 2**31 elements
    arr = random_array((lead, sum(sizes), trail), dtype, seed=lead)
    device_roundtrip(host_cupy, arr, 1, sizes)
    if lead > 1:
        launched = HarnessKernel.launches
        assert len(launched) == 2  # one launch each way, even or uneven
        code, tiles, itype, even = launched[0]
        assert code == relayout.kernel_source(width, wide_index) and itype == (np.int64 if wide_index else np.int32)
        total = arr.nbytes // width
        assert tiles == -(-total // (relayout.THREADS * relayout.PER_THREAD))
        assert even == (len(set(sizes)) == 1) and len(relayout._TABLES) == (0 if even else 1)


@pytest.mark.parametrize("offset,width", [(0, 16), (8, 8), (4, 4), (2, 2), (1, 1), (12, 4)])
def test_kernel_width_follows_alignment(host_cupy, offset, width):
    arr = random_array((6, 8, 4), np.uint8, seed=offset)  # runs of 4 x 4 bytes = 16 bytes
    device_roundtrip(host_cupy, arr, 1, (4, 4), offsets=(offset, 0))
    assert HarnessKernel.launches[0][0] == relayout.kernel_source(width, False)


@pytest.mark.parametrize("how", ["F", "strided", "reversed"])
@pytest.mark.parametrize("pattern", ["even", "uneven"])
def test_kernel_non_contiguous_and_converting(host_cupy, how, pattern):
    """Uneven blocks of other layouts: a contiguous temporary and one kernel; even ones one copyto."""
    sizes = PATTERNS[pattern]
    arr = layout(random_array((3, sum(sizes), 2), np.float32, seed=2), how).view(DeviceArray)
    want = reference_flat(arr, 1, sizes)
    buf = np.empty(arr.size, arr.dtype).view(DeviceArray)
    copy_blocks(buf, arr, host_cupy, 1, sizes, True)
    same_bits(np.asarray(buf), want)
    out = layout(np.zeros(arr.shape, arr.dtype), how).view(DeviceArray)
    copy_blocks(buf, out, host_cupy, 1, sizes, False)
    same_bits(np.asarray(out), np.asarray(arr))
    wide = np.empty(arr.size, np.float64).view(DeviceArray)
    copy_blocks(wide, arr, host_cupy, 1, sizes, True)
    np.testing.assert_array_equal(np.asarray(wide), want.astype(np.float64))
    kernels = len(HarnessKernel.launches)
    assert kernels == (0 if pattern == "even" else 3)


def test_kernel_tables_are_cached(host_cupy):
    arr = random_array((4, 6, 2), np.float32)
    for _ in range(3):
        device_roundtrip(host_cupy, arr, 1, (1, 2, 3))
    assert len(relayout._TABLES) == 1 and len(relayout._KERNELS) == 1


@pytest.mark.parametrize("refusal", [True, RuntimeError("the stream was capturing, but an error has invalidated")])
def test_kernel_during_stream_capture(host_cupy, refusal):
    """Even blocks need no table and run under capture; a new uneven layout cannot copy its table then."""
    arr = random_array((4, 6, 2), np.float32)
    device_roundtrip(host_cupy, arr, 1, (2, 1, 3))  # this layout's table is made before the capture
    host_cupy.cuda.get_current_stream().capturing = refusal
    device_roundtrip(host_cupy, arr, 1, (3, 3))
    device_roundtrip(host_cupy, arr, 1, (2, 1, 3))
    buf = np.empty(arr.size, arr.dtype).view(DeviceArray)
    with pytest.raises(
        hpccoll.TransportUnavailable,
        match=r"relayout of uneven blocks .* during CUDA stream capture "
        r"\(expected the same call, sizes=\[1, 2, 3\], made once before capturing",
    ):
        copy_blocks(buf, arr.view(DeviceArray), host_cupy, 1, (1, 2, 3), True)
    assert len(relayout._TABLES) == 1


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "cupy-path"])
def test_even_blocks_without_a_split_view(request, monkeypatch, device):
    """Were reshape ever to copy, the even path falls back (per block; or temporary + kernel) instead of
    writing into a copy."""
    monkeypatch.setattr(relayout, "_split_axis", lambda *args: None)
    arr = layout(random_array((3, 6, 2), np.float32, seed=3), "F")
    if not device:
        roundtrip(arr, 1, (2, 2, 2))
        return
    xp = request.getfixturevalue("host_cupy")
    arr = arr.view(DeviceArray)
    buf = np.empty(arr.size, arr.dtype).view(DeviceArray)
    copy_blocks(buf, arr, xp, 1, (2, 2, 2), True)
    out = np.asfortranarray(np.zeros(arr.shape, arr.dtype)).view(DeviceArray)
    copy_blocks(buf, out, xp, 1, (2, 2, 2), False)
    same_bits(np.asarray(buf), reference_flat(np.asarray(arr), 1, (2, 2, 2)))
    same_bits(np.asarray(out), np.asarray(arr))
    assert len(HarnessKernel.launches) == 2
