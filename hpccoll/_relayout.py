"""Block relayout between an array split along one axis and a flat buffer, rank after rank.

An all-gather or reduce-scatter along an axis other than 0 moves each rank's
block as ``lead`` rows of one contiguous *run* of bytes (the block's extent
along the axis times everything after the axis). :func:`copy_blocks` copies
between that layout and the flat wire buffer in which the blocks lie one
after another.

Both sides are seen as elements of the widest width -- 16, 8, 4, 2 or 1
bytes -- that divides every block's run (and, on CuPy, both buffers'
addresses), so a float32 relayout with 16-byte runs moves 16-byte elements:
fewer, wider loads and stores, bit for bit the same result.

* **CuPy**: one kernel launch for even and uneven blocks alike (a small
  ``RawKernel``, compiled on first use per element width and index width;
  each block's offsets come from a small table cached on the device).
  This kernel has not yet run on a GPU. It replaces one ``copyto`` of a 4-D
  view (far below a device-to-device copy's bandwidth, and a launch per
  uneven block), while the same copy on 16-byte elements came close to it,
  which is why both sides are widened here (docs/gpu.md, "Measured on an
  H200"; docs/benchmarks.md, "Figures kept out of the code"). The
  kernel's source is compiled as C++ and run on the CPU, thread block by
  thread block, by ``tests/test_relayout.py``; compiled by NVRTC and run on
  a GPU it is unverified.
* **NumPy**: the same views; even blocks in one ``numpy.copyto``, uneven
  blocks one ``copyto`` per block (NumPy has no single strided view of
  uneven blocks, and a copy per block beat a gather index when measured).

Arrays that are not C-contiguous, and copies that convert the dtype (the
16-bit float widening of reduce-scatter), take the general route: one
``copyto`` of a split-axis view for even blocks; for uneven ones a copy per
block on NumPy and, on CuPy, a contiguous temporary plus the kernel.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from ._errors import TransportUnavailable

__all__ = ["copy_blocks", "element_width", "per_block"]

#: The NumPy dtype that moves each element width (bit for bit).
_NUMPY_UNIT: Dict[int, np.dtype] = {
    16: np.dtype(np.complex128),
    8: np.dtype(np.uint64),
    4: np.dtype(np.uint32),
    2: np.dtype(np.uint16),
    1: np.dtype(np.uint8),
}


def element_width(run_bytes: int, *addresses: int) -> int:
    """The widest of 16, 8, 4, 2, 1 bytes dividing ``run_bytes`` and every address.

    ``run_bytes`` is the gcd of the blocks' contiguous runs (0: no constraint).

    Examples
    --------
    >>> element_width(48)
    16
    >>> element_width(48, 0x1004)
    4
    """
    bits = run_bytes
    for a in addresses:
        bits |= a
    return min(16, bits & -bits) if bits else 16


def copy_blocks(buf: Any, arr: Any, xp: Any, ax: int, sizes: Sequence[int], to_flat: bool) -> None:
    """Copy between ``arr`` (blocks along ``ax``) and flat ``buf`` (the blocks rank after rank).

    Block ``r`` is ``arr``'s slice ``sizes[r]`` long along ``ax``; in ``buf``
    it is that slice in C order, right after block ``r - 1``.

    Parameters
    ----------
    buf : array
        1-D and C-contiguous, ``arr.size`` elements. Its dtype may differ from
        ``arr``'s: values are then converted (``casting="unsafe"``).
    arr : array
        Any memory layout; ``arr.shape[ax] == sum(sizes)``.
    xp : module
        ``numpy`` or ``cupy`` (the module of both arrays).
    ax : int
        The split axis, ``0 <= ax < arr.ndim``.
    sizes : sequence of int
        Each block's extent along ``ax`` (zeros allowed).
    to_flat : bool
        ``True`` copies ``arr -> buf``; ``False`` copies ``buf -> arr``.
    """
    shape = arr.shape
    lead, trail = math.prod(shape[:ax]), math.prod(shape[ax + 1 :])
    if not lead * shape[ax] * trail:
        return
    if type(sizes) is not tuple and type(sizes) is not list:
        sizes = tuple(sizes)
    bd, ad = buf.dtype, arr.dtype
    if (bd is not ad and bd != ad) or not arr.flags.c_contiguous:
        _general(buf, arr, xp, ax, sizes, to_flat)
    elif lead == 1:  # the blocks already lie rank after rank
        flat = arr.reshape(-1)
        xp.copyto(buf, flat) if to_flat else xp.copyto(flat, buf)
    elif xp is np:
        _numpy(buf, arr, lead, trail * arr.itemsize, sizes, to_flat)
    elif not hasattr(xp, "RawKernel"):  # an array module without CUDA kernels (tests' CuPy stand-in)
        per_block(buf, arr, xp, ax, sizes, to_flat)
    else:
        _cupy(buf, arr, xp, lead, shape[ax] * trail * arr.itemsize, trail * arr.itemsize, sizes, to_flat)


# --------------------------------------------------------------------------- NumPy

#: Below this many runs (rows x blocks) the copy is too small for the extra views to pay.
NUMPY_MIN_RUNS = 32
_VOIDS: Dict[int, np.dtype] = {}


def _run_dtype(nbytes: int) -> np.dtype:
    """A dtype with one element per ``nbytes`` run, copied bit for bit."""
    e = _NUMPY_UNIT.get(nbytes) or _VOIDS.get(nbytes)
    if e is None:
        if len(_VOIDS) >= 1024:
            _VOIDS.clear()
        e = _VOIDS[nbytes] = np.dtype((np.void, nbytes))
    return e


def _numpy(buf: Any, arr: Any, lead: int, unit: int, sizes: Sequence[int], to_flat: bool) -> None:
    """Contiguous ``arr`` of ``buf``'s dtype: each block's run in a row as one element.

    NumPy's copy loops pay per inner loop, and an inner loop here is one run
    (``unit`` bytes per index along the axis, times the block's extent): seen
    as one element per run, the copy is one long loop over rows instead
    (bit for bit: NumPy copies elements of one dtype as raw bytes).
    """
    first, parts = sizes[0], len(sizes)
    if sizes.count(first) == parts:
        cells = arr.reshape(lead, parts, -1)
        blocks = buf.reshape(parts, lead, -1)
        if lead * parts >= NUMPY_MIN_RUNS:
            e = _run_dtype(first * unit)
            cells, blocks = cells.view(e), blocks.view(e)
        blocks = blocks.transpose(1, 0, 2)
        np.copyto(blocks, cells) if to_flat else np.copyto(cells, blocks)
        return
    grid, flat, own = arr.reshape(lead, -1), buf, arr.dtype
    runs = lead >= NUMPY_MIN_RUNS  # one element per run (cut from byte views); else own elements
    if runs:
        grid, flat = grid.view(np.uint8), flat.view(np.uint8)
    else:
        unit //= own.itemsize
    col = off = 0
    for s in sizes:
        if s:
            run = s * unit
            cells = grid[:, col : col + run]
            piece = flat[off : off + lead * run]
            if runs:
                e = _run_dtype(run)
                cells, piece = cells.view(e), piece.view(e)
            piece = piece.reshape(lead, -1)
            np.copyto(piece, cells) if to_flat else np.copyto(cells, piece)
            col += run
            off += lead * run


# --------------------------------------------------------------------------- any layout, any dtypes


def _general(buf: Any, arr: Any, xp: Any, ax: int, sizes: Sequence[int], to_flat: bool) -> None:
    """Non-contiguous ``arr``, or a dtype conversion: views of the arrays' own elements."""
    shape = arr.shape
    pre, post = shape[:ax], shape[ax + 1 :]
    first, parts = sizes[0], len(sizes)
    cells = _split_axis(arr, ax, parts, first) if sizes.count(first) == parts else None
    if cells is not None:  # even blocks: one copy between two views
        blocks = xp.moveaxis(buf.reshape((parts,) + pre + (first,) + post), 0, ax)
        dst, src = (blocks, cells) if to_flat else (cells, blocks)
        xp.copyto(dst, src, casting="unsafe")
        return
    if xp is not np:  # one kernel on a contiguous temporary rather than one launch per block
        _cupy_via_contiguous(buf, arr, xp, ax, sizes, to_flat)
        return
    per_block(buf, arr, xp, ax, sizes, to_flat)


def _split_axis(arr: Any, ax: int, parts: int, first: int) -> Any:
    """``arr`` with axis ``ax`` split into ``(parts, first)``, as a view (``None`` if reshape would copy).

    Splitting one axis never needs a copy, whatever the strides; the strides
    are checked anyway, so that a copy can never stand in for the view written to.
    """
    st = arr.strides
    shape = arr.shape[:ax] + (parts, first) + arr.shape[ax + 1 :]
    want = st[:ax] + (first * st[ax], st[ax]) + st[ax + 1 :]
    cells = arr.reshape(shape)
    if all(n == 1 or a == b for n, a, b in zip(shape, cells.strides, want)):
        return cells
    return None


def per_block(buf: Any, arr: Any, xp: Any, ax: int, sizes: Sequence[int], to_flat: bool) -> None:
    """:func:`copy_blocks` by one ``copyto`` per block (any layout, any dtypes; the way before issue 12)."""
    pre, post = arr.shape[:ax], arr.shape[ax + 1 :]
    start = offset = 0
    for s in sizes:
        count = math.prod(pre) * s * math.prod(post)
        piece = buf[offset : offset + count].reshape(pre + (s,) + post)
        cells = arr[(slice(None),) * ax + (slice(start, start + s),)]
        dst, src = (piece, cells) if to_flat else (cells, piece)
        xp.copyto(dst, src, casting="unsafe")
        start += s
        offset += count


def _cupy_via_contiguous(buf: Any, arr: Any, xp: Any, ax: int, sizes: Sequence[int], to_flat: bool) -> None:
    """Uneven blocks of a non-contiguous (or differently typed) CuPy array: temporary + one kernel."""
    if to_flat:
        same = xp.ascontiguousarray(arr, dtype=buf.dtype)  # converts too (unsafe casting, as copyto)
        copy_blocks(buf, same, xp, ax, sizes, True)
        return
    tmp = xp.empty(arr.shape, buf.dtype)
    copy_blocks(buf, tmp, xp, ax, sizes, False)
    xp.copyto(arr, tmp, casting="unsafe")


# --------------------------------------------------------------------------- CuPy

#: Threads per CUDA block, and elements each thread copies (a block copies one tile).
THREADS, PER_THREAD = 256, 8
#: Element counts from here on need 64-bit indices in the kernel.
INDEX32_LIMIT = 2**31 - THREADS * PER_THREAD

_C_UNIT = {16: "hpccoll_b16", 8: "unsigned long long", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}

# One thread block copies one tile of THREADS * PER_THREAD consecutive elements of the flat
# buffer. A thread finds its first element's block, row and column, then steps by blockDim.x
# and finds them again only when it leaves the row: long runs cost a load and a store per
# element, short ones a division more. Even blocks are found by arithmetic (no table, so
# nothing is copied to the device, ever); uneven ones by a binary search of a small table.
_SOURCE = r"""
struct alignas(16) hpccoll_b16 { unsigned long long lo, hi; };
typedef UNIT_T unit_t;
typedef INDEX_T index_t;

struct hpccoll_place { index_t base, next, len, col; };  // a block: flat start and end, run, first column

__device__ __forceinline__ void hpccoll_find(hpccoll_place& p, const index_t* table, int parts,
                                             index_t even, index_t lead, index_t i) {
    if (even) {  // every block `even` columns wide
        const index_t size = lead * even, r = i / size;
        p.base = r * size; p.next = p.base + size; p.len = even; p.col = r * even;
        return;
    }
    int lo = 0, hi = parts - 1;  // the last block starting at or before i: empty blocks are skipped
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (table[mid] <= i) lo = mid; else hi = mid - 1;
    }
    p.base = table[lo]; p.next = table[lo + 1]; p.col = table[parts + 1 + lo]; p.len = table[2 * parts + 1 + lo];
}

extern "C" __global__ void hpccoll_copy_blocks(
    unit_t* flat, unit_t* grid, const index_t* table, const int parts, const index_t even,
    const index_t lead, const index_t row, const index_t total, const int to_flat)
{
    // table (uneven blocks only): parts + 1 block starts in flat (the last is total), then each
    // block's first column within a row of grid, then its columns per row.
    const index_t step = (index_t)blockDim.x;
    const index_t tile = step * PER_THREAD;
    const index_t first = (index_t)blockIdx.x * tile;
    index_t i = first + (index_t)threadIdx.x;
    if (i >= total) return;
    const index_t stop = (total - first < tile) ? total : first + tile;
    hpccoll_place p;
    hpccoll_find(p, table, parts, even, lead, i);
    index_t l = (i - p.base) / p.len, c = (i - p.base) - l * p.len;
    for (;;) {
        const index_t g = l * row + p.col + c;
        if (to_flat) flat[i] = grid[g]; else grid[g] = flat[i];
        i += step;
        if (i >= stop) break;
        c += step;
        if (c >= p.len) {  // left the row: find the row, and the block, again
            if (i >= p.next) hpccoll_find(p, table, parts, even, lead, i);
            l = (i - p.base) / p.len;
            c = (i - p.base) - l * p.len;
        }
    }
}
"""


def kernel_source(width: int, wide_index: bool) -> str:
    """CUDA C++ of the relayout kernel ``hpccoll_copy_blocks`` for ``width``-byte elements."""
    index = "long long" if wide_index else "int"
    return _SOURCE.replace("UNIT_T", _C_UNIT[width]).replace("INDEX_T", index).replace("PER_THREAD", str(PER_THREAD))


def host_table(lead: int, unit: int, width: int, sizes: Sequence[int], itype: Any) -> np.ndarray:
    """The kernel's table, in ``width``-byte elements: block starts (and the total), columns, runs."""
    parts = len(sizes)
    table = np.empty(3 * parts + 1, itype)
    col = 0
    for r, s in enumerate(sizes):
        run = s * unit // width
        table[r] = lead * col
        table[parts + 1 + r] = col
        table[2 * parts + 1 + r] = run
        col += run
    table[parts] = lead * col
    return table


_KERNELS: Dict[Tuple[int, bool], Any] = {}
_TABLES: Dict[tuple, Any] = {}
_TABLES_KEPT = 64


def _kernel(xp: Any, width: int, wide_index: bool) -> Any:
    key = (width, wide_index)
    kernel = _KERNELS.get(key)
    if kernel is None:  # CuPy compiles it on first launch (and caches the binary on disk)
        kernel = _KERNELS[key] = xp.RawKernel(kernel_source(width, wide_index), "hpccoll_copy_blocks")
    return kernel


def _table(xp: Any, device: int, itype: Any, lead: int, unit: int, width: int, sizes: Sequence[int]) -> Any:
    """:func:`host_table` on ``device``, copied there once per layout and kept (up to 64 layouts).

    Raises
    ------
    TransportUnavailable
        The layout is new and the current stream is being captured into a CUDA
        graph: the copy to the device cannot be captured.
    """
    key = (device, itype, lead, unit, width, tuple(sizes))
    table = _TABLES.get(key)
    if table is None:
        if _capturing(xp):
            raise TransportUnavailable(
                "the relayout of uneven blocks along an axis other than 0 cannot run its first call for a layout "
                f"during CUDA stream capture (expected the same call, sizes={list(sizes)}, made once before "
                "capturing, which keeps its small table on the GPU; got a capturing stream)"
            )
        if len(_TABLES) >= _TABLES_KEPT:
            _TABLES.clear()
        table = _TABLES[key] = xp.asarray(host_table(lead, unit, width, sizes, itype))
    return table


def _capturing(xp: Any) -> bool:
    try:
        return bool(xp.cuda.get_current_stream().is_capturing())
    except Exception:  # capture invalidated, or the query refused during capture
        return True


def _cupy(buf: Any, arr: Any, xp: Any, lead: int, row: int, unit: int, sizes: Sequence[int], to_flat: bool) -> None:
    """Contiguous CuPy ``arr`` of ``buf``'s dtype: one kernel launch, even or uneven (``row``, ``unit`` in bytes)."""
    first = sizes[0]
    even = sizes.count(first) == len(sizes)
    data = buf.data
    width = element_width(unit * (first if even else math.gcd(*sizes)), data.ptr, arr.data.ptr)
    total = lead * row // width
    wide = total >= INDEX32_LIMIT
    itype = np.int64 if wide else np.int32
    if even:
        table, run = np.uint64(0), first * unit // width  # a null table: blocks found by arithmetic
    else:
        table, run = _table(xp, data.device_id, itype, lead, unit, width, sizes), 0
    tiles = -(-total // (THREADS * PER_THREAD))
    args = (
        buf,
        arr,
        table,
        np.int32(len(sizes)),
        itype(run),
        itype(lead),
        itype(row // width),
        itype(total),
        np.int32(to_flat),
    )
    _kernel(xp, width, wide)((tiles,), (THREADS,), args)
