"""Nothing lost: ``out=`` never aliases the input, zero-size arrays, integer overflow, large counts.

Every collective and adjoint, all_to_all included (it has no in-place form: any overlap of ``out``
with ``x`` is refused).
"""

import numpy as np
import pytest
from conftest import all_ranks, assert_same, make

import hpccoll
from hpccoll import ArgumentError

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(check=True)
    yield c
    c.free()


def _shifted(shape_a, shape_b, shift):
    """Two arrays over one buffer, ``b`` starting ``shift`` elements after ``a``: they overlap partly."""
    na, nb = int(np.prod(shape_a)), int(np.prod(shape_b))
    buf = np.zeros(max(na, shift + nb))
    return buf[:na].reshape(shape_a), buf[shift : shift + nb].reshape(shape_b)


def _window(full_shape, index, axis=0):
    """``(part, full)``: ``full`` of ``full_shape`` and ``part = buf[index]`` over one buffer with two spare rows.

    ``index`` selects along ``axis`` a window that overlaps ``full`` but is no rank's block of it
    (a rank's own block would be the in-place form, which is allowed).
    """
    shape = list(full_shape)
    shape[axis] += 2
    buf = np.zeros(shape)
    lead = (slice(None),) * axis
    return buf[lead + (index,)], buf[lead + (slice(0, full_shape[axis]),)]


# (name, call(comm) -> the collective with an overlapping ``out`` on every rank)
OVERLAPS = [
    (
        "all_gather/x-inside-out",
        lambda c: (lambda x, out: hpccoll.all_gather(x, c, out=out))(*_window((3 * c.size, 2), slice(1, 4))),
    ),
    (
        "all_gather/x-strided-in-out",
        lambda c: (lambda x, out: hpccoll.all_gather(x, c, out=out))(*_window((3 * c.size, 2), slice(0, 5, 2))),
    ),
    (
        "all_gather/x-reversed-in-out",
        lambda c: (lambda out: hpccoll.all_gather(out[::-1][:3], c, out=out))(np.zeros((3 * c.size, 2))),
    ),
    (
        "all_gather/inner-axis-window",
        lambda c: (lambda x, out: hpccoll.all_gather(x, c, axis=1, out=out))(
            *_window((2, 3 * c.size), slice(1, 4), axis=1)
        ),
    ),
    (
        "all_gather/one-element-shared",
        lambda c: (lambda x, out: hpccoll.all_gather(x, c, out=out))(*_shifted((3, 2), (3 * c.size, 2), 5)),
    ),
    (
        "reduce_scatter/out-inside-x",
        lambda c: (lambda out, x: hpccoll.reduce_scatter(x, c, out=out))(*_window((2 * c.size, 3), slice(1, 3))),
    ),
    (
        "reduce_scatter/out-reversed-tail",
        lambda c: (lambda x: hpccoll.reduce_scatter(x, c, out=x[-2:][::-1]))(np.ones((2 * c.size, 3))),
    ),
    (
        "reduce_scatter/out-strided",
        lambda c: (lambda out, x: hpccoll.reduce_scatter(x, c, out=out))(*_window((2 * c.size, 3), slice(1, 5, 2))),
    ),
    (
        "reduce_scatter/inner-axis",
        lambda c: (lambda out, x: hpccoll.reduce_scatter(x, c, axis=1, out=out))(
            *_window((3, 2 * c.size), slice(1, 5, 2), axis=1)
        ),
    ),
    ("all_reduce/reversed", lambda c: (lambda x: hpccoll.all_reduce(x, c, out=x[::-1]))(np.ones((4, 3)))),
    ("all_reduce/transposed", lambda c: (lambda x: hpccoll.all_reduce(x, c, out=x.T))(np.ones((3, 3)))),
    ("all_reduce/shifted", lambda c: (lambda x, out: hpccoll.all_reduce(x, c, out=out))(*_shifted((4, 3), (4, 3), 1))),
    (
        "all_gather_adjoint/out-inside-y",
        lambda c: (lambda out, y: hpccoll.all_gather_adjoint(y, c, out=out))(*_window((3 * c.size, 2), slice(1, 4))),
    ),
    (
        "reduce_scatter_adjoint/y-inside-out",
        lambda c: (lambda y, out: hpccoll.reduce_scatter_adjoint(y, c, out=out))(
            *_window((2 * c.size, 3), slice(1, 3))
        ),
    ),
    (
        "all_reduce_adjoint/varying-reversed",
        lambda c: (lambda y: hpccoll.all_reduce_adjoint(y, c, out=y[::-1]))(np.ones(5)),
    ),
    (
        "all_reduce_adjoint/replicated-reversed",
        lambda c: (lambda y: hpccoll.all_reduce_adjoint(y, c, cotangent="replicated", out=y[::-1]))(np.ones(5)),
    ),
    # all_to_all has no in-place form: out may not touch x at all, out=x included (before MPI with recv_sizes given,
    # else right after the size exchange, on every rank alike)
    ("all_to_all/out-is-x", lambda c: (lambda x: hpccoll.all_to_all(x, c, out=x))(np.ones((2 * c.size, 3)))),
    (
        "all_to_all/out-is-x-recv-sizes",
        lambda c: (lambda x: hpccoll.all_to_all(x, c, recv_sizes=[2] * c.size, out=x))(np.ones((2 * c.size, 3))),
    ),
    (
        "all_to_all/shifted",
        lambda c: (lambda x, out: hpccoll.all_to_all(x, c, out=out))(*_shifted((2 * c.size, 3), (2 * c.size, 3), 1)),
    ),
    (
        "all_to_all/transpose-window",
        lambda c: (
            lambda x, out: hpccoll.all_to_all(x, c, split_axis=1, concat_axis=0, recv_sizes=[2] * c.size, out=out)
        )(*_shifted((2, 3 * c.size), (2 * c.size, 3), 3 * c.size)),
    ),
    (
        "all_to_all_adjoint/out-reversed",
        lambda c: (lambda y: hpccoll.all_to_all_adjoint(y, c, out=y[::-1]))(np.ones(2 * c.size)),
    ),
    (
        "all_to_all_adjoint/out-strided",
        lambda c: (
            lambda b: hpccoll.all_to_all_adjoint(b[: 2 * c.size], c, sizes=[2] * c.size, out=b[::2][: 2 * c.size])
        )(np.ones(4 * c.size)),
    ),
]


@pytest.mark.parametrize("call", [c for _, c in OVERLAPS], ids=[n for n, _ in OVERLAPS])
def test_overlapping_out_is_refused(comm, call):
    """Every rank passes an ``out`` that shares memory with its input: every rank raises, before MPI sees it."""
    with pytest.raises(ArgumentError, match="out: expected memory separate from the input"):
        call(comm)


@pytest.mark.parametrize("fn", ["all_gather", "reduce_scatter", "all_gather_adjoint", "reduce_scatter_adjoint"])
def test_out_is_x_is_the_in_place_form(checked, fn):
    """``out=x`` where the shapes allow it (rank 0 holds everything) is the in-place form, done in place.

    It used to reach MPI as aliased buffers; now MPI_IN_PLACE carries it, zero-size arrays included.
    """
    sizes = [4] + [0] * (checked.size - 1)
    if fn in ("all_gather", "reduce_scatter_adjoint"):
        x = np.arange(sizes[checked.rank] * 2.0).reshape(-1, 2)
    else:
        x = np.arange(8.0).reshape(4, 2) + checked.rank
    want = getattr(hpccoll, fn)(x, checked, sizes=sizes)
    mine = x.copy()
    got = getattr(hpccoll, fn)(mine, checked, sizes=sizes, out=mine if checked.rank == 0 else None)
    assert (got is mine) == (checked.rank == 0)
    np.testing.assert_array_equal(got, want)
    empty = np.zeros((0, 2))
    assert hpccoll.all_gather(empty, checked, sizes=[0] * checked.size, out=empty) is empty


@pytest.mark.parametrize(
    "make_out", [lambda x: x, lambda x: x[...], lambda x: x.view()], ids=["x", "x[...]", "x.view()"]
)
@pytest.mark.parametrize("cotangent", [None, "replicated"])
def test_the_one_allowed_overlap_is_in_place(comm, make_out, cotangent):
    """``all_reduce(x, out=x)`` (or the same view under another name) reduces in place."""
    x = np.arange(6.0).reshape(2, 3) + 1
    want = x * comm.size if cotangent is None else x.copy()
    out = make_out(x)
    if cotangent is None:
        got = hpccoll.all_reduce(x, comm, out=out)
    else:
        got = hpccoll.all_reduce_adjoint(x, comm, cotangent=cotangent, out=out)
    assert got is out
    assert all_ranks(comm, np.array_equal(x, want))


def test_non_overlapping_views_of_one_buffer_are_fine(comm):
    buf = np.zeros((4 * comm.size, 3))
    x, out = buf[: 2 * comm.size], buf[2 * comm.size : 2 * comm.size + 2]
    x[...] = comm.rank + 1
    got = hpccoll.reduce_scatter(x, comm, out=out)
    assert got is out
    assert_same(out, np.full((2, 3), comm.size * (comm.size + 1) / 2))


@pytest.mark.parametrize("how", ["after", "interleaved"])
@pytest.mark.parametrize("axes", [(0, 0), (1, 0)], ids=["equal", "transpose"])
def test_all_to_all_beside_its_input_in_one_buffer(comm, axes, how):
    """``x`` and ``out`` in one buffer without a shared element: every block lands, nothing of ``x`` changes."""
    P, me = comm.size, comm.rank
    sa, ca = axes
    xs = [make((2 * P, 2 * P), "float64", 50 + r) for r in range(P)]  # every rank's input, made on every rank
    want = np.concatenate([np.split(x, P, axis=sa)[me] for x in xs], axis=ca)
    n, m = xs[me].size, want.size
    if how == "after":
        buf = np.zeros(n + m)
        x, out = buf[:n].reshape(xs[me].shape), buf[n:].reshape(want.shape)
    else:  # even and odd elements: the bounds overlap, the elements do not
        buf = np.zeros(2 * max(n, m))
        x, out = buf[0::2][:n].reshape(xs[me].shape), buf[1::2][:m].reshape(want.shape)
    x[...] = xs[me]
    got = hpccoll.all_to_all(x, comm, split_axis=sa, concat_axis=ca, out=out)
    assert all_ranks(comm, got is out and np.array_equal(out, want) and np.array_equal(x, xs[me]))


# --------------------------------------------------------------------------- zero-size arrays

ZERO_SIZE = {
    "all_gather": lambda c, out: hpccoll.all_gather(np.zeros((0, 3)), c, out=out),
    "all_gather/inner": lambda c, out: hpccoll.all_gather(np.zeros((2, 0)), c, axis=1, out=out),
    "reduce_scatter": lambda c, out: hpccoll.reduce_scatter(np.zeros((0, 3)), c, out=out),
    "reduce_scatter/empty-rows": lambda c, out: hpccoll.reduce_scatter(np.zeros((c.size, 0)), c, out=out),
    "all_reduce": lambda c, out: hpccoll.all_reduce(np.zeros((2, 0)), c, out=out),
    "all_gather_adjoint": lambda c, out: hpccoll.all_gather_adjoint(np.zeros((0, 3)), c, out=out),
    "reduce_scatter_adjoint": lambda c, out: hpccoll.reduce_scatter_adjoint(np.zeros((0, 3)), c, out=out),
    "all_reduce_adjoint": lambda c, out: hpccoll.all_reduce_adjoint(np.zeros(0), c, out=out),
    "all_reduce_adjoint/replicated": lambda c, out: hpccoll.all_reduce_adjoint(
        np.zeros(0), c, cotangent="replicated", out=out
    ),
    "all_to_all": lambda c, out: hpccoll.all_to_all(np.zeros((0, 3)), c, out=out),
    "all_to_all/inner": lambda c, out: hpccoll.all_to_all(np.zeros((2, 0)), c, split_axis=1, concat_axis=1, out=out),
    "all_to_all/transpose": lambda c, out: hpccoll.all_to_all(
        np.zeros((0, 0)), c, split_axis=1, concat_axis=0, out=out
    ),
    "all_to_all/recv_sizes": lambda c, out: hpccoll.all_to_all(np.zeros((0, 3)), c, recv_sizes=[0] * c.size, out=out),
    "all_to_all_adjoint": lambda c, out: hpccoll.all_to_all_adjoint(np.zeros((0, 3)), c, out=out),
}
ZERO_SHAPES = {
    "all_gather/inner": (2, 0),
    "reduce_scatter/empty-rows": (1, 0),
    "all_reduce": (2, 0),
    "all_to_all/inner": (2, 0),
    "all_to_all/transpose": (0, 0),
}


@pytest.mark.parametrize("check", [False, True], ids=["plain", "check"])
@pytest.mark.parametrize("with_out", [False, True], ids=["new", "out"])
@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_zero_size_everywhere(comm, name, with_out, check):
    """Every rank holds nothing: the right (empty) shape comes back, out= is honoured, nothing hangs."""
    shape = ZERO_SHAPES.get(name, (0,) if "all_reduce_adjoint" in name else (0, 3))
    with hpccoll.Communicator(comm, check=check) as c:
        out = np.zeros(shape) if with_out else None
        got = ZERO_SIZE[name](c, out)
        again = ZERO_SIZE[name](c, out)
        assert got.shape == shape and got.dtype == np.float64
        if with_out:
            assert got is out and again is out
        else:  # a new writeable array on every call: never None, never a shared constant
            assert type(got) is np.ndarray and got.flags.writeable and again is not got


# --------------------------------------------------------------------------- integer overflow

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("dtype", INTS)
def test_integer_overflow_wraps_like_numpy(comm, dtype, op):
    """MPI's integer SUM and PROD wrap around (two's complement), exactly as NumPy's do in the same dtype."""
    info = np.iinfo(dtype)
    # every rank's value is large enough that two of them overflow
    value = info.max - 3 if op == "sum" else (1 << (info.bits // 2 + 1)) + 1
    stack = np.full((comm.size, 2 * comm.size), value, dtype=dtype)
    stack[:, 1] = info.min if info.min else info.max  # wraps from the other end too
    want = (np.add if op == "sum" else np.multiply).reduce(stack, axis=0, dtype=dtype)
    got = hpccoll.all_reduce(stack[comm.rank], comm, op=op)
    assert_same(got, want)
    block = hpccoll.reduce_scatter(stack[comm.rank], comm, op=op)
    assert_same(block, want[2 * comm.rank : 2 * comm.rank + 2])
    if comm.size > 1 and op == "sum":
        assert want[0] != value * comm.size  # it did wrap


def test_int8_sum_wraps_a_worked_example(comm):
    """100 on every rank: 100 * P modulo 256, in [-128, 127] -- e.g. -56 on 2 ranks, 44 on 3."""
    got = hpccoll.all_reduce(np.array([100], dtype=np.int8), comm)
    assert int(got[0]) == (100 * comm.size + 128) % 256 - 128


def test_bool_sum_is_or_not_a_count(comm):
    got = hpccoll.all_reduce(np.array([True, comm.rank == 0]), comm)
    assert_same(got, np.array([True, True]))


@pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning"
)  # NumPy warns on the cast to inf, as its own sums do
def test_float16_sums_do_not_overflow_midway(comm):
    """16-bit floats are summed in float32 and rounded once: only a final result beyond 65504 is inf."""
    x = np.array([40000.0 if comm.rank % 2 == 0 else -40000.0, 40000.0], dtype=np.float16)
    got = hpccoll.all_reduce(x, comm)
    first = 40000.0 * (comm.size % 2)  # alternating signs cancel, however MPI orders the sum
    assert got[0] == np.float16(first)
    assert got[1] == (np.float16(40000.0) if comm.size == 1 else np.inf)  # 80000 > 65504


# --------------------------------------------------------------------------- messages over 2^31 elements

#: Elements in the large messages: past the 32-bit int counts of classic MPI (mpi4py 4 uses the MPI-4 ``_c`` calls).
BIG = 2**31 + 8
#: The data repeats with this period (prime, so a block misplaced by 2^k elements shows).
PERIOD = 251
#: Verify in chunks of whole periods, so no temporary is as large as the message.
CHUNK = PERIOD * (1 << 18)


def periodic(n, base):
    """``n`` elements repeating ``base`` (no temporary larger than the result)."""
    return np.resize(base, n)


def first_wrong(arr, base):
    """The index of the first chunk where ``arr`` differs from ``periodic(arr.size, base)``, or ``None``."""
    ref = np.resize(base, CHUNK)
    for start in range(0, arr.size, CHUNK):
        piece = arr[start : start + CHUNK]
        if not np.array_equal(piece, ref[: piece.size]):
            return start
    return None


def need_memory(comm, gib):
    """Skip (on every rank alike: rank 0 decides) unless ``gib`` GiB are available on the node."""
    import time

    verdict = None
    if comm.rank == 0:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable")) / 2**20
        verdict = (avail >= gib, avail)
    ok, avail = comm.mpi.bcast(verdict, root=0)
    if not ok:
        pytest.skip(f"needs about {gib:.0f} GiB of free memory; {avail:.1f} GiB available")
    return time.monotonic()


def report(comm, what, start):
    import time

    seconds = comm.mpi.allreduce(time.monotonic() - start, op=_max())
    if comm.rank == 0:
        print(f"\n{what}: {BIG} elements ({BIG / 2**30:.2f} GiB) at {comm.size} ranks in {seconds:.1f} s")


def _max():
    from mpi4py import MPI

    return MPI.MAX


@pytest.mark.large
@pytest.mark.mpi(min_size=2)
def test_all_gather_over_2_31_elements(comm):
    """Rank 0 sends 2^31 + 8 uint8 (Allgatherv with a count past INT_MAX); every rank gets them all."""
    start = need_memory(comm, 2 * (comm.size + 1) + 2)
    base = np.arange(PERIOD, dtype=np.uint8)
    sizes = [BIG] + [0] * (comm.size - 1)
    x = periodic(BIG, base) if comm.rank == 0 else np.empty(0, np.uint8)
    got = hpccoll.all_gather(x, comm, sizes=sizes)
    del x
    assert all_ranks(comm, got.size == BIG and first_wrong(got, base) is None)
    report(comm, "all_gather uint8", start)


@pytest.mark.large
@pytest.mark.mpi(min_size=2)
def test_all_reduce_bool_over_2_31_elements(comm):
    """2^31 + 8 bools reduced in place (Allreduce past INT_MAX): sum is OR, as in NumPy."""
    start = need_memory(comm, 4 * comm.size + 2)
    bases = [np.arange(PERIOD) % (comm.size + 1) == r for r in range(comm.size)]
    x = periodic(BIG, bases[comm.rank])
    assert hpccoll.all_reduce(x, comm, out=x) is x
    assert all_ranks(comm, first_wrong(x, np.logical_or.reduce(bases)) is None)
    report(comm, "all_reduce bool in place", start)


@pytest.mark.large
@pytest.mark.mpi(min_size=2)
def test_reduce_scatter_over_2_31_elements(comm):
    """Rank 0's block is 2^31 + 8 uint8 (Reduce_scatter with a count past INT_MAX)."""
    start = need_memory(comm, 4 * comm.size + 4)
    bases = [(np.arange(PERIOD) + 7 * r) % 50 for r in range(comm.size)]  # sums stay below 256
    x = periodic(BIG, bases[comm.rank].astype(np.uint8))
    got = hpccoll.reduce_scatter(x, comm, sizes=[BIG] + [0] * (comm.size - 1))
    del x
    want = (
        (got.size == BIG and first_wrong(got, sum(bases).astype(np.uint8)) is None) if comm.rank == 0 else got.size == 0
    )
    assert all_ranks(comm, want)
    report(comm, "reduce_scatter uint8", start)


@pytest.mark.large
@pytest.mark.mpi(min_size=2)
def test_all_to_all_over_2_31_elements(comm):
    """Rank 0 sends 2^31 + 8 uint8 to rank 1 (a point-to-point pair, or Alltoallv, with a count past INT_MAX).

    ``recv_sizes`` is learned: the size exchange carries the count past INT_MAX too.
    """
    start = need_memory(comm, 8)
    base = np.arange(PERIOD, dtype=np.uint8)
    me = comm.rank
    sizes = [0] * comm.size
    if me == 0:
        sizes[1] = BIG
    x = periodic(BIG, base) if me == 0 else np.empty(0, np.uint8)
    got = hpccoll.all_to_all(x, comm, sizes=sizes)
    del x
    assert all_ranks(comm, (got.size == BIG and first_wrong(got, base) is None) if me == 1 else got.size == 0)
    report(comm, "all_to_all uint8, rank 0 to rank 1", start)
