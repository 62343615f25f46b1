"""Shared fixtures: the world communicator, data makers and a NumPy reference.

Every test is written for any number of ranks: the data is a *global* array
with a leading rank axis, made identically on every rank from a seed, and
each rank takes its slice. References are computed with NumPy from the
global array.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import re

import numpy as np
import pytest

import hpccoll

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test extra installs it
    ml_dtypes = None

DTYPES = [np.dtype(n) for n in hpccoll.SUPPORTED_DTYPES if n != "bfloat16"]
if ml_dtypes is not None:
    DTYPES.append(np.dtype(ml_dtypes.bfloat16))
DTYPE_IDS = [d.name for d in DTYPES]

#: Shard extents along the split axis, for any number of ranks P.
SIZE_PATTERNS = {
    "even": lambda p: [2] * p,
    "uneven": lambda p: [(3 * r + 2) % 4 for r in range(p)],  # 2,1,0,3: a rank with 0 from P=3
    "empty-last": lambda p: [r + 1 for r in range(p - 1)] + [0],
}


def pytest_configure(config):
    """Give every MPI rank its own tmp_path root: ranks cleaning one shared root race each other."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.size > 1 and not config.option.basetemp:
        config.option.basetemp = os.path.join(tempfile.gettempdir(), f"hpccoll-pytest-rank{world.rank}")
    # The GPU stand-in's random mode (tests/standin_cupy.py) draws from one seed, the same on every rank.
    seed = os.environ.get("HPCCOLL_STANDIN_SEED", "").strip() or str(int.from_bytes(os.urandom(4), "little"))
    os.environ["HPCCOLL_STANDIN_SEED"] = world.bcast(seed, root=0)


def pytest_report_header(config):
    """Print the stand-in GPU's seed, so a failure in its random mode can be repeated."""
    seed = os.environ["HPCCOLL_STANDIN_SEED"]
    return f"GPU stand-in: random mode seed {seed} (repeat with HPCCOLL_STANDIN_SEED={seed})"


@pytest.fixture(scope="session")
def comm():
    c = hpccoll.Communicator()
    yield c
    c.free()


def make(shape, dtype, seed, kind="any"):
    """Deterministic data of ``dtype``; ``kind='exact'`` keeps sums exact in 16-bit floats."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        return rng.integers(lo, 4, size=shape).astype(dtype)
    if dtype.itemsize == 2 or kind == "exact":
        return (rng.integers(-8, 8, size=shape) / 4).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def layout(a, how, xp=np):
    """``a``'s values in another memory layout: C, Fortran, strided or reversed (0-D: a copy; ``xp``: the array module)."""
    if np.ndim(a) == 0:
        return xp.array(a)  # a 0-D array (ascontiguousarray would make it 1-D)
    if how == "C":
        return xp.ascontiguousarray(a)
    if how == "F":
        return xp.asfortranarray(a)
    if how == "strided":
        big = xp.zeros(tuple(2 * n for n in a.shape), dtype=a.dtype)
        view = big[tuple(slice(None, None, 2) for _ in a.shape)]
        view[...] = a
        return view
    if how == "reversed":
        rev = xp.ascontiguousarray(a[tuple(slice(None, None, -1) for _ in a.shape)])
        return rev[tuple(slice(None, None, -1) for _ in a.shape)]
    raise ValueError(how)


LAYOUTS = ["C", "F", "strided", "reversed"]


@contextlib.contextmanager
def forced_datatypes(forced=True):
    """Force the MPI-derived-datatype gathers (the large-array path) for small arrays too, or leave the thresholds."""
    from hpccoll.transports.host_mpi import HostMPI

    saved = HostMPI.strided_min_bytes, HostMPI.strided_min_piece
    if forced:
        HostMPI.strided_min_bytes = HostMPI.strided_min_piece = 0
    try:
        yield
    finally:
        HostMPI.strided_min_bytes, HostMPI.strided_min_piece = saved


def reference(stack, op):
    """NumPy reduction over the leading rank axis of ``stack`` in ``stack``'s dtype."""
    dtype = stack.dtype
    if op == "avg":
        wide = np.complex128 if dtype.kind == "c" else np.float64
        return stack.astype(wide).mean(axis=0).astype(dtype)
    if dtype.itemsize == 2 and dtype.kind not in "iu":
        wide = stack.astype(np.float64)
        ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
        return ufunc.reduce(wide, axis=0).astype(dtype)
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    return ufunc.reduce(stack, axis=0, dtype=dtype)


#: Machine epsilon and smallest subnormal of the 16-bit floats (bfloat16 has no np.finfo).
EPS16 = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
TINY16 = {"float16": 2.0**-24, "bfloat16": 2.0**-133}


def tolerance(dtype):
    """``rtol`` for comparing a reduction in ``dtype`` with the float64 reference."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return 0.0
    if dtype.itemsize == 2:  # a few units in the last place, relative to each value (see assert_close)
        return 4 * EPS16[dtype.name]
    return {4: 2e-6, 8: 1e-13}[dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize]


def assert_close(got, want):
    """Compare a reduction with its reference: exact for bool and integers, else by tolerance.

    16-bit floats are compared relative to each value's own magnitude (a fixed
    absolute tolerance would leave small values unchecked); wider floats, whose
    test data are O(1), with ``rtol = atol``.
    """
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    rtol = tolerance(want.dtype)
    if rtol == 0.0:
        np.testing.assert_array_equal(got, want)
        return
    wide = np.complex128 if want.dtype.kind == "c" else np.float64
    g, w = got.astype(wide), want.astype(wide)
    if want.dtype.itemsize == 2:
        tiny = TINY16[want.dtype.name]
        bad = ~((np.abs(g - w) <= rtol * np.abs(w) + tiny) | (np.isnan(g) & np.isnan(w)) | (g == w))
        assert not bad.any(), (
            f"{int(bad.sum())} of {bad.size} {want.dtype} values differ by more than rtol={rtol:.2g} of their "
            f"magnitude: got {g[bad][:5]}, want {w[bad][:5]}"
        )
    else:
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def assert_same(got, want):
    """Exact comparison for pure data movement: same dtype, shape and bits."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}") if got.dtype.itemsize <= 8 else got,
                                  want.view(f"u{want.dtype.itemsize}") if want.dtype.itemsize <= 8 else want)


def all_ranks(comm, ok):
    """True only when ``ok`` holds on every rank, so a test fails on all ranks together."""
    from mpi4py import MPI

    return comm.mpi.allreduce(bool(ok), op=MPI.LAND)


def pytest_terminal_summary(terminalreporter):
    """Say when the GPU tests were skipped, so they cannot vanish silently from every job."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "gpu" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_sep(
            "=", f"{len(skipped)} GPU tests (marker gpu) skipped, reasons above; on a GPU machine: make test-gpu",
            yellow=True,
        )


def raises_everywhere(comm, exc, match, call):
    """``call`` raises ``exc`` (its message matching ``match``), the same message on every rank.

    Collective whatever happens: a rank that returns or raises something else
    fails the test on every rank instead of leaving the others waiting.
    Returns the message.
    """
    try:
        call()
        seen = ("returned", "", False)
    except Exception as e:  # noqa: BLE001 - compared below, on every rank
        seen = (type(e).__name__, str(e), isinstance(e, exc) and re.search(match, str(e)) is not None)
    everyone = comm.mpi.allgather(seen)
    assert all(ok for _, _, ok in everyone) and len({m for _, m, _ in everyone}) == 1, everyone
    return everyone[0][1]


def pytest_collection_modifyitems(config, items):
    """``large`` tests (messages over 2^31 elements, many GiB) run only with HPCCOLL_TEST_LARGE=1 (make test-large).

    The decision depends on the environment only, so it is the same on every rank.
    """
    from hpccoll._comm import env_flag

    if env_flag("HPCCOLL_TEST_LARGE", False):
        return
    skip = pytest.mark.skip(reason="large: set HPCCOLL_TEST_LARGE=1 (make test-large) to run")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)
