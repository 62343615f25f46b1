"""Each collective's common-case branch against its general branch, bit for bit.

``hpccoll/collectives/{gather,scatter,reduce}.py`` each have an entry point
(``all_gather``, ``reduce_scatter``, ``all_reduce``) that sends the common
case -- a C-contiguous NumPy array along its first axis, plain ``sizes``,
a simple ``out``, a natively reduced (dtype, op), no check mode -- to
``_common``, and everything else to the general branch ``_one``; lists go
to ``_many``, whose common route packs one bucket of NumPy arrays in the
communicator's scratch buffers. These tests

- compare the branches bit for bit for every dtype, op and size pattern,
  single arrays, in-place forms and lists (both make the same MPI call);
- compare the blocking and non-blocking forms, which make different MPI
  calls (``MPI_Reduce_scatter`` and ``MPI_Ireduce_scatter``): MPI does not
  promise they reduce in one order, and Open MPI 5 does not (coll/tuned
  and libnbc), so they agree bit for bit where every order gives the same
  result -- integers, bool, max/min, and sums and products of exactly
  representable data (:func:`async_agrees`) -- and within the dtype's
  tolerance of the NumPy reference otherwise (docs/mpi.md);
- check that the common branch really is taken for the common case (a
  change that quietly disables it fails here) and that every case it must
  decline reaches the general branch, with the general branch's result or
  error;
- record the transport primitives each branch calls (both must reach the
  network only through the transports ``c.transport_of("numpy", ...)``
  hands out -- the one for the kind, or the host transport it composes --
  with the same primitive and counts), and the watchdog on the common branch;
- let ranks take different branches in one call.

Checks are made on every rank together (conftest's :func:`agree`), so that a
rank failing alone does not leave the others waiting in the next collective.
Tests named ``test_bug_*`` pin bugs found while writing this file; they fail
until the bug is fixed (see their docstrings).
"""

import contextlib
import re

import numpy as np
import pytest
from conftest import (
    DTYPE_IDS,
    DTYPES,
    SIZE_PATTERNS,
    agree,
    assert_close,
    layout,
    make,
    raises_everywhere,
    reference,
    widening_error,
)
from mpi4py import MPI

import hpccoll
from hpccoll.collectives import all_gather as gather  # the modules, by their collectives' short names
from hpccoll.collectives import all_reduce as reduce
from hpccoll.collectives import reduce_scatter as scatter
from hpccoll.transports import _control, host_mpi

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test extra installs it
    ml_dtypes = None

pytestmark = pytest.mark.mpi

OPS = ["sum", "prod", "max", "min", "avg"]
#: module -> (its short name, its entry point's name)
MODULES = {gather: ("gather", "all_gather"), scatter: ("scatter", "reduce_scatter"), reduce: ("reduce", "all_reduce")}
PRIMITIVES = (
    "allgatherv",
    "iallgatherv",
    "reduce_scatter",
    "ireduce_scatter",
    "allreduce",
    "iallreduce",
    "allgather_into",
)


@pytest.fixture(scope="module")
def c():
    """The world, never in check mode (``HPCCOLL_CHECK`` set outside must not hide the common branch)."""
    comm = hpccoll.Communicator(check=False)
    yield comm
    comm.free()


# --------------------------------------------------------------------------- helpers


def plan_or_skip(c, dtype, op):
    """The (dtype, op) plan on ``c``'s NumPy transport; skip pairs the general branch refuses."""
    try:
        t = c.transport_of("numpy")
        return hpccoll._dtypes.reduce_plan(np.dtype(dtype), op, t.native_reduce, t.saturates)
    except hpccoll.DTypeError:
        pytest.skip("the general branch raises for this pair (tests/test_errors.py)")


def _bits(a):
    return (type(a).__name__, a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())


def same_bits(c, a, b):
    """NumPy arrays of one dtype, shape and bits (on every rank)."""
    ok = type(a) is np.ndarray and type(b) is np.ndarray and _bits(a) == _bits(b)
    agree(c, ok, f"{a!r} vs {b!r}")


def same_lists(c, got, want):
    agree(c, isinstance(got, list) and isinstance(want, list) and len(got) == len(want), (got, want))
    for g, w in zip(got, want):
        same_bits(c, g, w)


def equal(c, got, want):
    """The same values (``numpy.array_equal``) on every rank."""
    agree(c, np.array_equal(got, want), f"{got!r} vs {want!r}")


def async_agrees(c, blocking, nonblocking, dtype, shape, op, stack, rows=...):
    """The non-blocking form against the blocking one (see the module docstring).

    ``blocking(x)`` and ``nonblocking(x)`` run the two forms on this rank's
    ``x``. Random data: the non-blocking result within tolerance of the NumPy
    reference of ``stack`` (every rank's ``x``; its ``rows``). Data whose every
    reduction order is exact (``make(..., kind="exact")``): the two forms'
    bits are equal, on any MPI.
    """
    x = make(shape, dtype, seed=c.rank)
    close(c, nonblocking(x), stack, op, rows)
    exact = make(shape, dtype, seed=c.rank, kind="exact")
    # A complex product's zero imaginary parts take their sign from the order (-0 + -0 against -0 + 0): equal
    # values there; the same bits everywhere else.
    same = equal if np.dtype(dtype).kind == "c" and op == "prod" else same_bits
    same(c, nonblocking(exact), blocking(exact))


def close(c, got, stack, op, rows=...):
    """conftest's ``assert_close`` (dtype tolerance) against the NumPy reference of ``stack`` (its ``rows``), on
    every rank."""
    assert_close(got, reference(stack, op)[rows], c, slack=widening_error(stack, op)[rows])


class Trace:
    """What one call did: the general branches it entered, the network calls, the scratch it got."""

    def __init__(self):
        self.general = []  # "gather._one", "reduce._many", ... in the order entered
        self.calls = []  # transport primitives (and the size exchange), described
        self.scratch = []  # one bool per scratch request: whether buffers were handed out


def _buf(b):
    return None if b is None else (b.dtype.str, int(b.size))


def _describe(name, args):
    """A transport call as comparable data: buffers by (dtype, size), counts, op."""
    if name.endswith("allgatherv"):
        send, recv, counts = args
        return (name, _buf(send), _buf(recv), tuple(map(int, counts)))
    if name.endswith("reduce_scatter"):
        send, recv, counts, op = args
        return (name, _buf(send), _buf(recv), tuple(map(int, counts)), op)
    if name.endswith("allreduce"):
        send, recv, op = args
        return (name, _buf(send), _buf(recv), op)
    send, out, lead, trail, sizes = args  # allgather_into
    return (name, _buf(send), _buf(out), lead, trail, tuple(sizes))


def _recorded(log, name, fn):
    def call(*args):
        log.append(_describe(name, args))
        return fn(*args)

    return call


def _entered(log, label, fn):
    def call(*args):
        log.append(label)
        return fn(*args)

    return call


@contextlib.contextmanager
def traced(c, *, no_scratch=False):
    """Record the branches entered and the transport calls made on ``c``; ``no_scratch`` refuses scratch buffers.

    Refusing scratch is what :func:`hpccoll._core.launch.scratch` does above
    its size limit: the list forms then pack into fresh buffers (their general
    route).
    """
    t = Trace()
    front = c.transport_of("numpy")
    watched = [front] + [host for host in (getattr(front, "host", None),) if host is not None]
    with pytest.MonkeyPatch.context() as m:
        for mod, (short, _) in MODULES.items():
            for fn in ("_one", "_many"):
                m.setattr(mod, fn, _entered(t.general, f"{short}.{fn}", getattr(mod, fn)))
            real = mod.scratch

            def scratch(comm, nbytes, real=real):
                pair = None if no_scratch else real(comm, nbytes)
                t.scratch.append(pair is not None)
                return pair

            m.setattr(mod, "scratch", scratch)
        real_exchange = gather.exchange_extents

        def exchange(comm, arrays, axes, what):
            t.calls.append(("exchange", len(arrays), tuple(axes)))
            return real_exchange(comm, arrays, axes, what)

        m.setattr(gather, "exchange_extents", exchange)
        for transport in watched:
            for name in PRIMITIVES:  # instance attributes shadow the class's methods until removed
                setattr(transport, name, _recorded(t.calls, name, getattr(transport, name)))
        try:
            yield t
        finally:
            for transport in watched:
                for name in PRIMITIVES:
                    delattr(transport, name)


def entry(mod, *args):
    """The public road into ``mod`` (``gather.all_gather`` ...): same arguments as its ``_one``."""
    return getattr(mod, MODULES[mod][1])(*args)


def outcome(call):
    """``("ok", dtype, shape, bytes)`` of a single-array result, or ``(error type, message)``."""
    try:
        a = call()
    except hpccoll.HpccollError as e:
        return (type(e).__name__, str(e))
    return ("ok", a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) if type(a) is np.ndarray else ("?", a)


def declines(c, mod, args, raises=None, want=None):
    """``mod``'s entry reaches its general branch with ``args()``; the result (or error) is ``_one``'s own.

    ``args`` makes fresh arguments for each call (an in-place form changes
    them). ``raises`` is ``(exception type, regex)``; ``want`` a reference
    result. Errors must be of the same type on every rank.
    """
    with traced(c) as t:
        got = outcome(lambda: entry(mod, *args()))
    agree(c, t.general == [f"{MODULES[mod][0]}._one"], t.general)
    agree(c, got == outcome(lambda: mod._one(*args())))
    if raises is not None:
        agree(c, got[0] == raises[0].__name__ and re.search(raises[1], got[1]), got)
        everyone = c.mpi.allgather(got[0])  # messages may name the rank
        agree(c, everyone == [got[0]] * c.size, lambda: f"error types differ between ranks: {everyone}")
    else:
        agree(c, got[0] == "ok", got)
        if want is not None:
            agree(c, got[1:] == ("ok", want.dtype.str, want.shape, np.ascontiguousarray(want).tobytes())[1:])


class _Elsewhere(np.ndarray):
    """A NumPy subclass: ``type(x) is numpy.ndarray`` fails, so the common branch never takes it."""


def general_only(a):
    """``a``'s values in an array only the general branch takes: a strided view (a subclass when empty)."""
    v = layout(a, "strided")
    return v if not v.flags.c_contiguous else np.array(a).view(_Elsewhere)


def blocks_of(sizes, r):
    return sum(sizes[:r]), sum(sizes[: r + 1])


def scatter_case(c, pattern):
    """A reduce-scatter's ``sizes`` (``None``: array_split's), the extent ``n`` split, and this rank's block."""
    sizes = None if pattern == "none" else SIZE_PATTERNS[pattern](c.size)
    n = 2 * c.size + 1 if sizes is None else sum(sizes)
    return (sizes, n) + blocks_of(hpccoll.split_sizes(n, c.size) if sizes is None else sizes, c.rank)


# --------------------------------------------------------------------------- single arrays, bit for bit


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_reduce_common_equals_general(c, dtype, op):
    plan = plan_or_skip(c, dtype, op)
    x = make((3, 4), dtype, seed=c.rank)
    before = x.copy()
    with traced(c) as common:
        got = reduce.all_reduce(x, c, op, None, "all_reduce", False)
    with traced(c) as general:
        want = reduce._one(x, c, op, None, "all_reduce", False)
    # Widened 16-bit floats take the general branch; every other pair the common one.
    agree(c, common.general == (["reduce._one"] if plan.widen else []))
    agree(c, common.calls == general.calls and [k[0] for k in common.calls] == ["allreduce"])
    same_bits(c, got, want)
    same_bits(c, x, before)
    stack = np.stack([make((3, 4), dtype, seed=q) for q in range(c.size)])
    close(c, got, stack, op)
    out = np.empty_like(x)
    with traced(c) as t:
        agree(c, reduce.all_reduce(x, c, op, out, "all_reduce", False) is out)
    agree(c, t.general == common.general and t.calls == common.calls)
    same_bits(c, out, got)
    with traced(c) as t:
        request = reduce.all_reduce(x, c, op, None, "all_reduce", True)
        result = request.wait()
    agree(c, t.general == common.general and [k[0] for k in t.calls] == ["iallreduce"])
    blocking = lambda a: reduce.all_reduce(a, c, op, None, "all_reduce", False)  # noqa: E731
    async_agrees(
        c, blocking, lambda a: reduce.all_reduce(a, c, op, None, "all_reduce", True).wait(), dtype, (3, 4), op, stack
    )
    async_agrees(
        c, blocking, lambda a: reduce._one(a, c, op, None, "all_reduce", True).wait(), dtype, (3, 4), op, stack
    )
    close(c, result, stack, op)
    same_bits(c, hpccoll.all_reduce(x, c, op=op), got)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_gather_common_equals_general(c, dtype, pattern):
    sizes = SIZE_PATTERNS[pattern](c.size)
    for tail, axis in (((), 0), ((), -1), ((2, 3), 0), ((2, 3), -3)):
        x = make((sizes[c.rank],) + tail, dtype, seed=c.rank)
        before = x.copy()
        full = np.concatenate([make((sizes[q],) + tail, dtype, seed=q) for q in range(c.size)])
        for given in (sizes, tuple(sizes), None):  # None: one size exchange, then the same branch
            with traced(c) as common:
                got = gather.all_gather(x, c, axis, given, None, "all_gather", False)
            with traced(c) as general:
                want = gather._one(x, c, axis, given, None, "all_gather", False)
            agree(c, common.general == [])
            agree(c, common.calls == general.calls)
            agree(c, [k[0] for k in common.calls] == ([] if given else ["exchange"]) + ["allgatherv"])
            same_bits(c, got, want)
            same_bits(c, got, full)
        same_bits(c, x, before)
        out = np.empty_like(full)
        with traced(c) as t:
            agree(c, gather.all_gather(x, c, axis, tuple(sizes), out, "all_gather", False) is out)
        agree(c, t.general == [])
        same_bits(c, out, full)
        with traced(c) as t:
            same_bits(c, gather.all_gather(x, c, axis, sizes, None, "all_gather", True).wait(), full)
        agree(c, t.general == [] and [k[0] for k in t.calls] == ["iallgatherv"])
        same_bits(c, gather._one(x, c, axis, sizes, None, "all_gather", True).wait(), full)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", ["none"] + sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_scatter_common_equals_general(c, dtype, op, pattern):
    plan = plan_or_skip(c, dtype, op)
    sizes, n, lo, hi = scatter_case(c, pattern)
    x = make((n, 3), dtype, seed=c.rank)
    before = x.copy()
    with traced(c) as common:
        got = scatter.reduce_scatter(x, c, op, 0, sizes, None, "reduce_scatter", False)
    with traced(c) as general:
        want = scatter._one(x, c, op, 0, sizes, None, "reduce_scatter", False)
    # Widened dtypes and empty blocks take the general branch (a rank-local choice: the same
    # transport call either way, which the other ranks make from the common branch).
    agree(c, common.general == (["scatter._one"] if plan.widen or lo == hi else []))
    agree(c, common.calls == general.calls and [k[0] for k in common.calls] == ["reduce_scatter"])
    same_bits(c, got, want)
    same_bits(c, x, before)
    stack = np.stack([make((n, 3), dtype, seed=q) for q in range(c.size)])
    close(c, got, stack, op, slice(lo, hi))
    out = np.empty_like(got)
    with traced(c) as t:
        agree(c, scatter.reduce_scatter(x, c, op, 0, sizes, out, "reduce_scatter", False) is out)
    agree(c, t.general == common.general and t.calls == common.calls)
    same_bits(c, out, got)
    with traced(c) as t:
        result = scatter.reduce_scatter(x, c, op, 0, sizes, None, "reduce_scatter", True).wait()
    agree(c, t.general == common.general and [k[0] for k in t.calls] == ["ireduce_scatter"])
    async_agrees(
        c,
        lambda a: scatter.reduce_scatter(a, c, op, 0, sizes, None, "reduce_scatter", False),
        lambda a: scatter.reduce_scatter(a, c, op, 0, sizes, None, "reduce_scatter", True).wait(),
        dtype,
        (n, 3),
        op,
        stack,
        slice(lo, hi),
    )
    close(c, result, stack, op, slice(lo, hi))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_in_place_common_equals_general(c, op, pattern):
    """The in-place forms (out=x; x a block of out; out a block of x) on both branches, bit for bit."""
    P, r = c.size, c.rank
    sizes = SIZE_PATTERNS[pattern](P)
    lo, hi = blocks_of(sizes, r)
    x = make((sum(sizes), 3), np.float64, seed=r)
    stack = np.stack([make((sum(sizes), 3), np.float64, seed=q) for q in range(P)])
    # all_reduce, out=x
    a, b = x.copy(), x.copy()
    with traced(c) as common:
        agree(c, reduce.all_reduce(a, c, op, a, "all_reduce", False) is a)
    with traced(c) as general:
        agree(c, reduce._one(b, c, op, b, "all_reduce", False) is b)
    agree(c, common.general == [] and common.calls == general.calls)
    agree(c, common.calls[0][1] is None)  # MPI_IN_PLACE
    same_bits(c, a, b)
    close(c, a, stack, op)
    # all_gather: x is this rank's block of out
    full = make((sum(sizes), 3), np.float64, seed=5)
    g1, g2 = np.zeros_like(full), np.zeros_like(full)
    g1[lo:hi], g2[lo:hi] = full[lo:hi], full[lo:hi]
    with traced(c) as common:
        agree(c, gather.all_gather(g1[lo:hi], c, 0, sizes, g1, "all_gather", False) is g1)
    with traced(c) as general:
        agree(c, gather._one(g2[lo:hi], c, 0, sizes, g2, "all_gather", False) is g2)
    agree(c, common.general == [] and common.calls == general.calls)
    agree(c, (common.calls[0][1] is None) == (lo < hi))  # in place unless this rank's block is empty
    same_bits(c, g1, full)
    same_bits(c, g2, full)
    # reduce_scatter: out is this rank's block of x
    s1, s2 = x.copy(), x.copy()
    o1, o2 = s1[lo:hi], s2[lo:hi]
    with traced(c) as common:
        agree(c, scatter.reduce_scatter(s1, c, op, 0, sizes, o1, "reduce_scatter", False) is o1)
    with traced(c) as general:
        agree(c, scatter._one(s2, c, op, 0, sizes, o2, "reduce_scatter", False) is o2)
    # An empty block: the general branch, which makes the same transport call.
    agree(c, common.general == (["scatter._one"] if lo == hi else []))
    agree(c, common.calls == general.calls)
    same_bits(c, o1, o2)
    close(c, o1, stack, op, slice(lo, hi))
    # Views that only overlap (not the exact block) are no in-place form: the general branch refuses them.
    y = np.arange(2.0 * P * 3).reshape(2 * P, 3)
    shifted = (lambda z: z[2 * r + 1 : 2 * r + 3]) if r < P - 1 else (lambda z: z[2 * r - 1 : 2 * r + 1])

    def fresh():
        z = y.copy()
        return z, c, op, 0, [2] * P, shifted(z), "reduce_scatter", False

    declines(c, scatter, fresh, raises=(hpccoll.ArgumentError, "overlaps"))


# --------------------------------------------------------------------------- the common branch is taken


@pytest.mark.mpi(min_size=2)
def test_common_branch_is_taken(c, monkeypatch):
    """With the general branches made to fail, every common-case call still succeeds (and is right)."""

    def refuse(*args):
        raise AssertionError("the general branch was taken for a common case")

    for mod in MODULES:
        monkeypatch.setattr(mod, "_one", refuse)
    P, r = c.size, c.rank
    x = np.arange(6.0) + r
    total = sum(np.arange(6.0) + q for q in range(P))
    equal(c, hpccoll.all_reduce(x, c), total)
    equal(c, hpccoll.all_reduce(x, c, op="avg"), total / P)
    out = np.empty(6)
    agree(c, hpccoll.all_reduce(x, c, out=out) is out)
    y = x.copy()
    agree(c, hpccoll.all_reduce(y, c, out=y) is y)
    equal(c, y, total)
    equal(c, hpccoll.all_reduce(x, c, async_op=True).wait(), total)
    equal(c, hpccoll.all_reduce_adjoint(x, c), total)
    stacked = np.concatenate([np.arange(6.0) + q for q in range(P)])
    for kw in ({}, {"sizes": [6] * P}, {"sizes": (6,) * P}, {"axis": -1}, {"out": np.empty(6 * P)}):
        equal(c, hpccoll.all_gather(x, c, **kw), stacked)
    equal(c, hpccoll.all_gather(x, c, async_op=True, sizes=[6] * P).wait(), stacked)
    g = np.zeros(6 * P)
    g[6 * r : 6 * r + 6] = x
    agree(c, hpccoll.all_gather(g[6 * r : 6 * r + 6], c, sizes=[6] * P, out=g) is g)
    equal(c, g, stacked)
    equal(c, hpccoll.reduce_scatter_adjoint(x, c, sizes=[6] * P), stacked)
    z = np.tile(x, P)  # 6P elements: 6 per rank
    mine = np.tile(total, P)[6 * r : 6 * r + 6]
    for kw in ({}, {"sizes": [6] * P}, {"out": np.empty(6)}, {"op": "avg"}):
        want = mine / P if kw.get("op") == "avg" else mine
        equal(c, hpccoll.reduce_scatter(z, c, **kw), want)
    equal(c, hpccoll.reduce_scatter(z, c, async_op=True).wait(), mine)
    equal(c, hpccoll.all_gather_adjoint(z, c), mine)
    w = z.copy()
    agree(c, hpccoll.reduce_scatter(w, c, out=w[6 * r : 6 * r + 6]) is not None)
    equal(c, w[6 * r : 6 * r + 6], mine)
    # Lists: one bucket of same-shape NumPy arrays goes through the scratch buffers.
    for mod, call, want in (
        (reduce, lambda: hpccoll.all_reduce([x, x + 1], c), [total, total + P]),
        (gather, lambda: hpccoll.all_gather([x, x + 1], c), [stacked, stacked + 1]),
        (scatter, lambda: hpccoll.reduce_scatter([z, z + 1], c), [mine, mine + P]),
    ):
        with traced(c) as t:
            got = call()
        agree(c, t.general == [f"{MODULES[mod][0]}._many"] and t.scratch == [True])
        for g_, w_ in zip(got, want):
            equal(c, g_, w_)


# --------------------------------------------------------------------------- declines


@pytest.mark.mpi(min_size=2)
def test_all_reduce_declines(c):
    """Cases the common branch leaves to the general branch: the result (or error) is the general branch's."""
    P, r = c.size, c.rank
    x = np.arange(6.0 * P).reshape(2 * P, 3) + r
    total = sum(np.arange(6.0 * P).reshape(2 * P, 3) + q for q in range(P))

    def ro():
        o = np.empty_like(x)
        o.flags.writeable = False
        return o

    def lookalike():  # the same memory, other strides: no in-place form
        z = x[:1].copy()
        return z, c, "sum", z[0][None], "all_reduce", False

    def read_only_in_place():
        z = x.copy()
        z.flags.writeable = False
        return z, c, "sum", z, "all_reduce", False

    def same_view():  # out=x[...]: the in-place form, but not `out is x`
        z = x.copy()
        return z, c, "sum", z[...], "all_reduce", False

    A = hpccoll.ArgumentError
    declines(c, reduce, lambda: (x[:, ::2], c, "sum", None, "all_reduce", False), want=total[:, ::2])
    declines(c, reduce, lambda: (x, c, "sum", x[::-1], "all_reduce", False), raises=(A, "overlaps"))
    declines(
        c,
        reduce,
        lambda: (x, c, "sum", np.empty((2 * P, 3), np.float32), "all_reduce", False),
        raises=(A, "out: expected dtype float64"),
    )
    declines(
        c,
        reduce,
        lambda: (x, c, "sum", np.empty((3, 2 * P)), "all_reduce", False),
        raises=(A, r"out: expected shape \(%d, 3\)" % (2 * P)),
    )
    declines(c, reduce, lambda: (x, c, "sum", ro(), "all_reduce", False), raises=(A, "out: expected a writeable"))
    declines(c, reduce, lambda: (x, c, MPI.SUM, None, "all_reduce", False), want=total)  # the general branch maps it
    declines(c, reduce, lambda: (x, c, "median", None, "all_reduce", False), raises=(A, "op: expected one of"))
    declines(c, reduce, lambda: (x, c, np.array("sum"), None, "all_reduce", False), raises=(A, "op: expected"))
    declines(
        c, reduce, lambda: (x.astype(np.float16), c, "sum", None, "all_reduce", False), want=total.astype(np.float16)
    )  # widened to float32
    declines(c, reduce, lambda: (np.empty((0, 3)), c, "sum", None, "all_reduce", False), want=np.empty((0, 3)))
    declines(
        c,
        reduce,
        lambda: (x.astype(">f8"), c, "sum", None, "all_reduce", False),
        raises=(hpccoll.DTypeError, "native-byte-order"),
    )
    declines(c, reduce, lookalike, raises=(A, "overlaps"))
    declines(c, reduce, read_only_in_place, raises=(A, "writeable"))
    declines(c, reduce, same_view, want=total)
    declines(c, reduce, lambda: (x.view(_Elsewhere), c, "sum", None, "all_reduce", False), want=total)
    # The public functions: the general branch's errors and results.
    raises_everywhere(c, A, "out: expected a writeable array", lambda: hpccoll.all_reduce(x, c, out=ro()))
    raises_everywhere(c, A, "op: expected one of", lambda: hpccoll.all_reduce(x, c, op="median"))
    equal(c, hpccoll.all_reduce(x, c, op=MPI.SUM), total)


@pytest.mark.mpi(min_size=2)
def test_all_gather_declines(c):
    P, r = c.size, c.rank
    x = np.arange(6.0 * P).reshape(2 * P, 3) + r
    rows = np.concatenate([np.arange(6.0 * P).reshape(2 * P, 3) + q for q in range(P)])
    cols = np.concatenate([np.arange(6.0 * P).reshape(2 * P, 3) + q for q in range(P)], axis=1)
    sizes = [2 * P] * P
    A = hpccoll.ArgumentError

    def ro():
        o = np.empty((2 * P * P, 3))
        o.flags.writeable = False
        return o

    def shifted():  # x overlaps out but is not this rank's block of it
        o = np.empty((2 * P * P, 3))
        return o[1 : 2 * P + 1], c, 0, sizes, o, "all_gather", False

    def lookalike():  # x is this rank's row of out, with other strides
        o = np.zeros((P, 3))
        o[r] = x[0]
        return o[r][None], c, 0, [1] * P, o, "all_gather", False

    def strided(given):  # an out only the general branch can fill
        return x, c, 0, given, np.empty((2 * P * P, 6))[:, ::2], "all_gather", False

    declines(c, gather, lambda: (np.asfortranarray(x), c, 0, sizes, None, "all_gather", False), want=rows)
    declines(c, gather, lambda: (x[:, ::2], c, 0, sizes, None, "all_gather", False), want=rows[:, ::2])
    declines(c, gather, lambda: (x, c, 1, [3] * P, None, "all_gather", False), want=cols)  # inner axis
    declines(c, gather, lambda: (x, c, 1, None, None, "all_gather", False), want=cols)
    declines(
        c,
        gather,
        lambda: (x, c, False, sizes, None, "all_gather", False),
        raises=(A, "axis: expected an int; got bool"),
    )  # bool is not an axis
    declines(c, gather, lambda: (x, c, 0, [np.int64(2 * P)] * P, None, "all_gather", False), want=rows)
    declines(
        c,
        gather,
        lambda: (x, c, 0, [2 * P] * (P + 1), None, "all_gather", False),
        raises=(A, f"sizes: expected {P} non-negative ints"),
    )
    declines(
        c,
        gather,
        lambda: (x, c, 0, [2 * P + 1] * P, None, "all_gather", False),
        raises=(A, rf"sizes: expected sizes\[{r}\] == x.shape\[0\]"),
    )
    declines(
        c, gather, lambda: (x, c, 0, [2 * P] * (P - 1) + [-1], None, "all_gather", False), raises=(A, "sizes: expected")
    )
    for given in (sizes, None):  # None: the common branch exchanges, then hands over
        declines(
            c,
            gather,
            lambda: (x, c, 0, given, np.empty((2 * P * P, 3), np.float32), "all_gather", False),
            raises=(A, "out: expected dtype float64"),
        )
        declines(
            c,
            gather,
            lambda: (x, c, 0, given, np.empty((2 * P * P, 4)), "all_gather", False),
            raises=(A, "out: expected shape"),
        )
        declines(c, gather, lambda: (x, c, 0, given, ro(), "all_gather", False), raises=(A, "writeable"))
        declines(c, gather, lambda: strided(given), want=rows)
    with traced(c) as t:  # an out the common branch declines after the size exchange: exchanged once
        gather.all_gather(*strided(None))
    agree(c, t.general == ["gather._one"] and [k[0] for k in t.calls] == ["exchange", "allgatherv"], t.calls)
    declines(c, gather, shifted, raises=(A, "overlaps"))
    declines(c, gather, lookalike, raises=(A, "overlaps"))
    declines(
        c, gather, lambda: (np.empty((0, 3)), c, 0, [0] * P, None, "all_gather", False), want=np.empty((0, 3))
    )  # an empty result
    declines(
        c,
        gather,
        lambda: (x.astype(">f8"), c, 0, sizes, None, "all_gather", False),
        raises=(hpccoll.DTypeError, "native-byte-order"),
    )
    declines(
        c,
        gather,
        lambda: (np.zeros(x.shape, "M8[s]"), c, 0, sizes, None, "all_gather", False),
        raises=(hpccoll.DTypeError, "expected a native-byte-order dtype"),
    )
    raises_everywhere(
        c,
        A,
        rf"sizes: expected sizes\[{r}\]",  # the message names the rank
        lambda: hpccoll.all_gather(x, c, sizes=[2 * P + 1] * P),
        same_message=False,
    )
    got = hpccoll.all_gather(x[:1], c, sizes=[np.int64(1)] * P)
    equal(c, got, rows[:: 2 * P])


@pytest.mark.mpi(min_size=2)
def test_reduce_scatter_declines(c):
    P, r = c.size, c.rank
    x = np.arange(6.0 * P).reshape(2 * P, 3) + r
    total = sum(np.arange(6.0 * P).reshape(2 * P, 3) + q for q in range(P))
    mine = total[2 * r : 2 * r + 2]
    A = hpccoll.ArgumentError

    def ro_out():
        o = np.empty((2, 3))
        o.flags.writeable = False
        return o

    def ro_block():  # this rank's block of x, read-only
        z = x.copy()
        o = z[2 * r : 2 * r + 2]
        o.flags.writeable = False
        return z, c, "sum", 0, None, o, "reduce_scatter", False

    def ro_input():  # this rank's block of a read-only x
        z = x.copy()
        z.flags.writeable = False
        return z, c, "sum", 0, None, z[2 * r : 2 * r + 2], "reduce_scatter", False

    def zero_stride():  # y[r][None] has strides (0, 8): not y[r:r+1]
        y = np.arange(3.0 * P).reshape(P, 3)
        return y, c, "sum", 0, None, y[r][None], "reduce_scatter", False

    def args(z=x, op="sum", axis=0, sizes=None, out=None):
        return lambda: (z, c, op, axis, sizes, out() if callable(out) else out, "reduce_scatter", False)

    declines(c, scatter, args(np.asfortranarray(x)), want=mine)
    declines(c, scatter, args(x[:, ::2]), want=mine[:, ::2])
    lo, hi = blocks_of(hpccoll.split_sizes(3, P), r)
    declines(c, scatter, args(axis=1), want=total[:, lo:hi])  # inner axis
    declines(c, scatter, args(axis=True), raises=(A, "axis: expected an int; got bool"))
    declines(c, scatter, args(op=MPI.SUM), want=mine)
    declines(c, scatter, args(op="median"), raises=(A, "op: expected one of"))
    declines(c, scatter, args(x.astype(np.float16)), want=mine.astype(np.float16))  # widened
    declines(c, scatter, args(np.empty((0, 3))), want=np.empty((0, 3)))
    declines(c, scatter, args(sizes=[np.int64(2)] * P), want=mine)
    declines(c, scatter, args(sizes=[2] * (P + 1)), raises=(A, f"sizes: expected {P} non-negative ints"))
    declines(c, scatter, args(sizes=[1] * P), raises=(A, "sizes: expected ints summing to"))
    declines(c, scatter, args(out=lambda: np.empty((2, 3), np.float32)), raises=(A, "out: expected dtype float64"))
    declines(c, scatter, args(out=lambda: np.empty((3, 2))), raises=(A, r"out: expected shape \(2, 3\)"))
    declines(c, scatter, args(out=ro_out), raises=(A, "writeable"))
    declines(c, scatter, args(out=lambda: np.empty((2, 6))[:, ::2]), want=mine)  # strided out
    declines(c, scatter, ro_block, raises=(A, "writeable"))
    declines(c, scatter, ro_input, raises=(A, "writeable"))
    declines(c, scatter, zero_stride, raises=(A, "overlaps"))
    declines(c, scatter, args(x.astype(">f8")), raises=(hpccoll.DTypeError, "native-byte-order"))
    for form, match in ((ro_block, "writeable"), (zero_stride, "overlaps")):  # the public function too
        raises_everywhere(c, A, match, lambda: (lambda a: hpccoll.reduce_scatter(a[0], c, out=a[5]))(form()))
    # Array "ops" are no op, in the adjoints too.
    raises_everywhere(
        c, A, "op: expected", lambda: hpccoll.reduce_scatter_adjoint(np.ones(2), c, op=np.array("sum"), sizes=[2] * P)
    )
    raises_everywhere(
        c, A, "op: expected", lambda: hpccoll.all_reduce_adjoint(np.ones(2), c, op=np.array(["sum", "avg"]))
    )


def test_not_in_check_mode_or_size_one(c):
    """Check mode and one-rank communicators: always the general branches (the common ones assume neither)."""
    P, r = c.size, c.rank
    checked = hpccoll.Communicator(c.mpi, check=True)
    alone = hpccoll.Communicator(MPI.COMM_SELF, check=False)
    x = np.arange(4.0) + r
    total = sum(np.arange(4.0) + q for q in range(P))
    rows = np.concatenate([np.arange(4.0) + q for q in range(P)])
    z = np.tile(x, P)
    mine = np.tile(total, P)[4 * r : 4 * r + 4]
    try:
        for comm, want in ((checked, (total, rows, mine)), (alone, (x, x, x))):
            for mod, call, expected in (
                (reduce, lambda: hpccoll.all_reduce(x, comm), want[0]),
                (gather, lambda: hpccoll.all_gather(x, comm, sizes=[4] * comm.size), want[1]),
                (gather, lambda: hpccoll.all_gather(x, comm), want[1]),
                (scatter, lambda: hpccoll.reduce_scatter(z if comm is checked else x, comm), want[2]),
            ):
                with traced(comm) as t:
                    got = call()
                agree(c, t.general == [f"{MODULES[mod][0]}._one"], t.general)
                equal(c, got, expected)
            for mod, call, expected in (
                (reduce, lambda: hpccoll.all_reduce([x, x], comm), [want[0]] * 2),
                (gather, lambda: hpccoll.all_gather([x, x], comm), [want[1]] * 2),
                (scatter, lambda: hpccoll.reduce_scatter([z, z] if comm is checked else [x, x], comm), [want[2]] * 2),
            ):
                with traced(comm) as t:
                    got = call()
                agree(c, t.general == [f"{MODULES[mod][0]}._many"], t.general)
                if comm is alone:
                    agree(c, t.calls == [] and t.scratch == [])  # one rank: copies, no transport
                for g, w in zip(got, expected):
                    equal(c, g, w)
    finally:
        checked.free()
        alone.free()


# --------------------------------------------------------------------------- the transport, watched


@pytest.mark.mpi(min_size=2)
def test_common_branch_watched(c, monkeypatch):
    """With HPCCOLL_TIMEOUT the common branch's MPI calls go through the watchdog (in the transport)."""
    monkeypatch.setenv("HPCCOLL_TIMEOUT", "60")
    w = hpccoll.Communicator(c.mpi, check=False, transport="mpi")  # host MPI's calls, whatever the run named
    ran, watched, waited = [], [], []
    real_run, real_watched, real_wait = host_mpi.run, _control.watched, host_mpi.watched
    monkeypatch.setattr(host_mpi, "run", lambda comm, name, *a, **k: (ran.append(name), real_run(comm, name, *a, **k)))
    monkeypatch.setattr(
        _control, "watched", lambda comm, what, *a: (watched.append(what), real_watched(comm, what, *a))[1]
    )
    monkeypatch.setattr(host_mpi, "watched", lambda comm, what, *a: (waited.append(what), real_wait(comm, what, *a))[1])
    try:
        agree(c, w.timeout == 60)
        P = w.size
        uneven = [1 + q % 2 for q in range(P)]
        with traced(w) as t:
            equal(c, hpccoll.all_reduce(np.ones(3), w), np.full(3, P))
            equal(c, hpccoll.all_gather(np.ones(2), w, sizes=[2] * P), np.ones(2 * P))
            equal(c, hpccoll.reduce_scatter(np.ones(2 * P), w), np.full(2, P))
            equal(c, hpccoll.all_gather(np.ones(uneven[w.rank]), w, sizes=uneven), np.ones(sum(uneven)))
            equal(c, hpccoll.reduce_scatter(np.ones(sum(uneven)), w, sizes=uneven), np.full(uneven[w.rank], P))
        agree(c, t.general == [])
        names = ["Allreduce", "Allgather", "Reduce_scatter_block", "Allgatherv", "Reduce_scatter"]
        agree(c, waited == [f"MPI_{n}" for n in names])  # the transport's blocking calls, watched
        del waited[:]
        # Non-blocking: the wait is watched.
        with traced(w) as t:
            equal(c, hpccoll.all_reduce(np.ones(3), w, async_op=True).wait(), np.full(3, P))
        agree(c, t.general == [] and waited == ["MPI_Allreduce"])
    finally:
        w.free()


# --------------------------------------------------------------------------- ranks on different branches


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_ranks_may_take_different_branches(c, pattern):
    """Whether a rank takes the common branch is a local decision: both make the same transport call."""
    P, r = c.size, c.rank
    odd = r % 2 == 1  # odd ranks: the general branch
    sizes = SIZE_PATTERNS[pattern](P)
    lo, hi = blocks_of(sizes, r)
    full = make((sum(sizes), 3), np.float64, seed=7)
    x = general_only(full[lo:hi]) if odd else np.ascontiguousarray(full[lo:hi])
    stack = np.stack([make((sum(sizes), 3), np.float64, seed=q) for q in range(P)])
    y = general_only(stack[r]) if odd else stack[r]
    verdicts = []

    def record(t, what, branch, result):
        """Record this rank's verdict; every rank compares its transport calls (primitive, dtype, counts, op)."""
        mine = [(k[0],) + k[2:] if k[0] == "exchange" else (k[0], k[2][0]) + k[3:] for k in t.calls]
        everyone = c.mpi.allgather(mine)  # on every rank, whatever the verdict
        verdicts.append((what, bool(branch), bool(result), all(e == everyone[0] for e in everyone)))

    for given in (sizes, None):
        with traced(c) as t:
            got = hpccoll.all_gather(x, c, sizes=given)
        record(t, f"all_gather sizes={given}", t.general == (["gather._one"] if odd else []), np.array_equal(got, full))
    with traced(c) as t:
        block = hpccoll.reduce_scatter(y, c, sizes=sizes)
    record(
        t,
        "reduce_scatter",
        t.general == (["scatter._one"] if odd or lo == hi else []),
        np.allclose(block, stack.sum(0)[lo:hi], rtol=1e-12),
    )
    with traced(c) as t:
        total = hpccoll.all_reduce(y, c)
    record(t, "all_reduce", t.general == (["reduce._one"] if odd else []), np.allclose(total, stack.sum(0), rtol=1e-12))
    # Lists: odd ranks pass out= (or, for all_reduce, get no scratch): no scratch route there.
    xs = [np.ascontiguousarray(full[lo:hi]), np.ascontiguousarray(full[lo:hi]) * 2]
    with traced(c) as t:
        got = hpccoll.all_gather(xs, c, sizes=sizes, out=[np.empty_like(full), np.empty_like(full)] if odd else None)
    record(
        t,
        "list all_gather",
        t.scratch == ([] if odd else [True]),
        np.array_equal(got[0], full) and np.array_equal(got[1], 2 * full),
    )
    ys = [stack[r], 2 * stack[r]]
    with traced(c) as t:
        got = hpccoll.reduce_scatter(ys, c, sizes=sizes, out=[np.empty((hi - lo, 3)) for _ in ys] if odd else None)
    record(
        t,
        "list reduce_scatter",
        t.scratch == ([] if odd or lo == hi else [True]),
        np.allclose(got[1], 2 * stack.sum(0)[lo:hi], rtol=1e-12),
    )
    with traced(c, no_scratch=odd) as t:
        got = hpccoll.all_reduce(ys, c)
    record(t, "list all_reduce", t.scratch == [not odd], np.allclose(got[1], 2 * stack.sum(0), rtol=1e-12))
    agree(c, all(v[1] and v[2] and v[3] for v in verdicts), lambda: f"(what, branch, result, same calls): {verdicts}")


# --------------------------------------------------------------------------- lists


LIST_SHAPES = {
    "one shape": [(4,)] * 5,
    "one 2-D shape": [(2, 3)] * 4,
    "mixed shapes": [(3,), (2, 2), (), (1, 0), (5,)],
    "zero-d": [()] * 3,
}


def not_aliasing_scratch(c, got, again):
    """``got`` keeps its values while ``again()`` reuses the scratch buffers."""
    saved = [g.copy() for g in got]
    again()
    for g, s in zip(got, saved):
        same_bits(c, g, s)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shapes", sorted(LIST_SHAPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_all_reduce_scratch_equals_general(c, dtype, op, shapes):
    plan = plan_or_skip(c, dtype, op)

    def inputs(rank):
        xs = [np.asarray(make(s, dtype, seed=10 * rank + i)) for i, s in enumerate(LIST_SHAPES[shapes])]
        xs[0] = np.asfortranarray(xs[0])  # any layout: concatenated in C order (a 0-D array becomes 1-D)
        xs[-1] = np.repeat(xs[-1], 2, axis=-1)[..., ::2] if xs[-1].ndim else xs[-1]  # a strided view
        return xs

    xs = inputs(c.rank)
    before = [x.copy() for x in xs]
    with traced(c) as common:
        got = reduce.all_reduce(xs, c, op, None, "all_reduce", False)
    with traced(c, no_scratch=True) as general:
        want = reduce.all_reduce(xs, c, op, None, "all_reduce", False)
    agree(c, common.general == general.general == ["reduce._many"])
    # Natively reduced: packed and moved in the scratch buffers; widened: fresh buffers.
    agree(c, common.scratch == ([] if plan.widen else [True]))
    agree(c, common.calls == general.calls and [k[0] for k in common.calls] == ["allreduce"])
    same_lists(c, got, want)
    for x, b in zip(xs, before):
        same_bits(c, x, b)  # inputs untouched
    everyone = [inputs(q) for q in range(c.size)]
    for i, g in enumerate(got):
        close(c, g, np.stack([e[i] for e in everyone]), op)
    not_aliasing_scratch(
        c, got, lambda: reduce.all_reduce([np.zeros_like(x) for x in xs], c, op, None, "all_reduce", False)
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("tail", [(), (3,)])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_all_gather_scratch_equals_general(c, dtype, pattern, tail):
    sizes = SIZE_PATTERNS[pattern](c.size)
    xs = [np.asarray(make((sizes[c.rank],) + tail, dtype, seed=10 * c.rank + i)) for i in range(4)]
    if tail:
        xs[1] = np.asfortranarray(xs[1])  # packed by numpy.concatenate instead of bytes.join
    full = [np.concatenate([make((sizes[q],) + tail, dtype, seed=10 * q + i) for q in range(c.size)]) for i in range(4)]
    for given in (sizes, None):
        with traced(c) as common:
            got = gather.all_gather(xs, c, 0, given, None, "all_gather", False)
        with traced(c, no_scratch=True) as general:
            want = gather.all_gather(xs, c, 0, given, None, "all_gather", False)
        agree(c, common.general == general.general == ["gather._many"])
        agree(c, common.scratch == [True])
        agree(c, common.calls == general.calls)
        agree(c, [k[0] for k in common.calls] == ([] if given else ["exchange"]) + ["allgatherv"])
        same_lists(c, got, want)
        same_lists(c, got, full)
    not_aliasing_scratch(
        c, got, lambda: gather.all_gather([np.zeros_like(x) for x in xs], c, 0, sizes, None, "all_gather", False)
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", ["none"] + sorted(SIZE_PATTERNS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_list_reduce_scatter_scratch_equals_general(c, dtype, op, pattern):
    plan = plan_or_skip(c, dtype, op)
    sizes, n, lo, hi = scatter_case(c, pattern)
    xs = [np.asarray(make((n, 2), dtype, seed=10 * c.rank + i)) for i in range(3)]
    before = [x.copy() for x in xs]
    with traced(c) as common:
        got = scatter.reduce_scatter(xs, c, op, 0, sizes, None, "reduce_scatter", False)
    with traced(c, no_scratch=True) as general:
        want = scatter.reduce_scatter(xs, c, op, 0, sizes, None, "reduce_scatter", False)
    agree(c, common.general == general.general == ["scatter._many"])
    # Widened dtypes and empty blocks: fresh buffers (the latter a rank-local choice, same call).
    agree(c, common.scratch == ([] if plan.widen or lo == hi else [True]))
    agree(c, common.calls == general.calls and [k[0] for k in common.calls] == ["reduce_scatter"])
    same_lists(c, got, want)
    for x, b in zip(xs, before):
        same_bits(c, x, b)
    for i, g in enumerate(got):
        stack = np.stack([make((n, 2), dtype, seed=10 * q + i) for q in range(c.size)])
        close(c, g, stack, op, slice(lo, hi))
    not_aliasing_scratch(
        c,
        got,
        lambda: scatter.reduce_scatter([np.zeros_like(x) for x in xs], c, op, 0, sizes, None, "reduce_scatter", False),
    )


def _list_declines(c, mod, make_args, raises=None, want=None, general=None):
    """A list call through ``mod``'s entry takes no scratch route; the same outcome with scratch refused."""
    outcomes = []
    for refuse in (False, True):
        with traced(c, no_scratch=refuse) as t:
            try:
                got = entry(mod, *make_args())
                outcomes.append(("ok", [(g.dtype.str, g.shape, np.ascontiguousarray(g).tobytes()) for g in got]))
            except hpccoll.HpccollError as e:
                outcomes.append((type(e).__name__, str(e)))
        agree(c, t.general == [general or f"{MODULES[mod][0]}._many"], t.general)
        if not refuse:
            agree(c, not any(t.scratch), t.scratch)
    agree(c, outcomes[0] == outcomes[1], outcomes)
    if raises is not None:
        agree(c, outcomes[0][0] == raises[0].__name__ and re.search(raises[1], outcomes[0][1]), outcomes[0])
        everyone = c.mpi.allgather(outcomes[0])
        agree(c, all(e == everyone[0] for e in everyone))
    else:
        agree(c, outcomes[0][0] == "ok", outcomes[0])
        if want is not None:
            agree(c, outcomes[0][1] == [(w.dtype.str, w.shape, np.ascontiguousarray(w).tobytes()) for w in want])


@pytest.mark.mpi(min_size=2)
def test_list_all_reduce_declines(c, monkeypatch):
    P = c.size
    xs = [np.ones(3), np.ones(2)]
    A = hpccoll.ArgumentError

    def args(x, op="sum", out=None, async_op=False):
        return lambda: (x, c, op, out() if callable(out) else out, "all_reduce", async_op)

    _list_declines(
        c, reduce, args([np.ones(3), np.ones(2, np.float32)]), want=[np.full(3, P, "f8"), np.full(2, P, "f4")]
    )
    _list_declines(
        c, reduce, args([np.ones(3), [1.0, 2.0]]), raises=(A, r"x\[1\]: expected an array .*; got list")
    )  # an array and a list of numbers: the list form, whose x[1] is refused
    _list_declines(c, reduce, args([]), want=[])
    _list_declines(c, reduce, args([np.empty(0)]), want=[np.empty(0)])
    _list_declines(c, reduce, args(xs, op="median"), raises=(A, "op: expected one of"))
    _list_declines(c, reduce, args([np.ones(2, np.float16)] * 2), want=[np.full(2, P, np.float16)] * 2)  # widened
    _list_declines(c, reduce, args([np.ones(2, ">f8")] * 2), raises=(hpccoll.DTypeError, "native-byte-order"))
    # out given (one dtype): the scratch route, then copied into out -- see test_bug_list_all_reduce_out.
    _list_declines(
        c,
        reduce,
        args([np.ones(3), np.ones(2, "f4")], out=lambda: [np.empty(3), np.empty(2, "f4")]),
        want=[np.full(3, P, "f8"), np.full(2, P, "f4")],
    )
    monkeypatch.setattr(c, "bucket_bytes", 32)  # 40 bytes: more than one bucket
    _list_declines(c, reduce, args(xs), want=[np.full(3, P, "f8"), np.full(2, P, "f8")])
    monkeypatch.undo()
    with traced(c) as t:  # non-blocking: never the shared scratch (a later call would overwrite it)
        request = hpccoll.all_reduce(xs, c, async_op=True)
        now = hpccoll.all_reduce([2 * x for x in xs], c)  # blocking, in the scratch buffers, meanwhile
        later = request.wait()
    agree(c, t.scratch == [True])
    agree(c, [g.tolist() for g in later] == [[P] * 3, [P] * 2])
    agree(c, [g.tolist() for g in now] == [[2 * P] * 3, [2 * P] * 2])


@pytest.mark.mpi(min_size=2)
def test_list_gather_and_scatter_decline(c):
    P, r = c.size, c.rank
    xs = [np.ones((2, 3)) * r, np.ones((2, 3)) * r]
    rows = np.repeat(np.arange(P, dtype=float), 2)[:, None] * np.ones(3)
    A = hpccoll.ArgumentError

    def g(x, axis=0, sizes=(2,) * P, out=None):
        return lambda: (x, c, axis, list(sizes), out() if callable(out) else out, "all_gather", False)

    def s(x, op="sum", axis=0, sizes=None, out=None):
        return lambda: (x, c, op, axis, sizes, out() if callable(out) else out, "reduce_scatter", False)

    _list_declines(
        c,
        gather,
        g(xs, axis=1, sizes=[3] * P),
        want=[np.concatenate([np.ones((2, 3)) * q for q in range(P)], axis=1)] * 2,
    )
    _list_declines(c, gather, g([np.ones((2, 3)), np.ones((2, 4))]), want=[np.ones((2 * P, 3)), np.ones((2 * P, 4))])
    _list_declines(c, gather, g([np.ones(2), np.ones(2, np.float32)]), want=[np.ones(2 * P), np.ones(2 * P, "f4")])
    _list_declines(c, gather, g(xs, out=lambda: [np.empty((2 * P, 3)) for _ in range(2)]), want=[rows, rows])
    _list_declines(c, gather, g([]), want=[])
    _list_declines(c, gather, g([np.ones(2, ">f8")] * 2), raises=(hpccoll.DTypeError, "native-byte-order"))
    _list_declines(c, gather, g([np.ones(2, "M8[s]")] * 2), raises=(hpccoll.DTypeError, "native-byte-order"))
    raises_everywhere(
        c,
        hpccoll.DTypeError,
        "native-byte-order",
        lambda: hpccoll.all_gather([np.ones(2, ">f8")] * 2, c, sizes=[2] * P),
    )
    zs = [np.ones((2 * P, 3)), np.ones((2 * P, 3))]
    _list_declines(c, scatter, s(zs, axis=1), want=[np.full((2 * P, hpccoll.split_sizes(3, P)[r]), P, "f8")] * 2)
    _list_declines(c, scatter, s([np.ones(2 * P, np.float16)] * 2), want=[np.full(2, P, np.float16)] * 2)  # widened
    _list_declines(c, scatter, s([]), want=[])
    _list_declines(
        c, scatter, s([np.ones(2 * P), np.ones(2 * P, np.float32)]), want=[np.full(2, P * 1.0), np.full(2, P, "f4")]
    )  # two dtypes
    _list_declines(c, scatter, s(zs, out=lambda: [np.empty((2, 3)) for _ in zs]), want=[np.full((2, 3), P * 1.0)] * 2)
    _list_declines(c, scatter, s(zs, op="median"), raises=(A, "op: expected one of"))
    for mod, call, want in (  # non-blocking: no scratch, even while a blocking call uses it
        (gather, lambda a: hpccoll.all_gather(a, c, sizes=[2] * P, async_op=True), [rows, rows]),
        (scatter, lambda a: hpccoll.reduce_scatter(a, c, async_op=True), [np.full((2, 3), P * 1.0)] * 2),
    ):
        arrays = xs if mod is gather else zs
        with traced(c) as t:
            request = call(arrays)
            (hpccoll.all_gather if mod is gather else hpccoll.reduce_scatter)([5 * a for a in arrays], c)
            got = request.wait()
        agree(c, t.scratch == [True])  # the blocking call only
        for a, b in zip(got, want):
            equal(c, a, b)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_list_all_gather_discovers_sizes(c, pattern):
    """sizes=None: one exchange, then the scratch route for uniform extents."""
    P, r = c.size, c.rank
    sizes = SIZE_PATTERNS[pattern](P)
    xs = [np.asarray(make((sizes[r], 2), np.float32, seed=10 * r + i)) for i in range(3)]
    with traced(c) as t:
        got = gather.all_gather(xs, c, 0, None, None, "all_gather", False)
    agree(c, [k[0] for k in t.calls] == ["exchange", "allgatherv"] and t.scratch == [True])
    for i, g in enumerate(got):
        same_bits(c, g, gather._one(xs[i], c, 0, sizes, None, "all_gather", False))
    raises_everywhere(
        c,
        hpccoll.MismatchError,
        "ranks 0 and 1 disagree",  # "this rank has ...": per rank
        lambda: hpccoll.all_gather(np.ones((1, 2 + (r == 1))), c),
        same_message=False,
    )


# --------------------------------------------------------------------------- bugs found


def _each_array_alone(got_call, alone_call, n):
    """What differs between the list call's results and each array's own call (dtype, shape, bits), on this rank.

    The single-array calls come first, so every rank makes them whatever the
    list call does.
    """
    wants = [alone_call(i) for i in range(n)]
    try:
        got = got_call()
        wrong = []
        for i, want in enumerate(wants):
            g = got[i]
            if g.dtype != want.dtype or g.shape != want.shape or g.tobytes() != np.ascontiguousarray(want).tobytes():
                wrong.append(
                    f"x[{i}]: got {g.dtype} {g.shape} {g.tolist()}, want {want.dtype} {want.shape} {want.tolist()}"
                )
        return "; ".join(wrong)
    except Exception as e:  # noqa: BLE001 - reported through the verdict, on every rank together
        return f"raised {type(e).__name__}: {e}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [False, True], ids=["plain", "check-mode"])
@pytest.mark.parametrize("pattern", sorted(SIZE_PATTERNS))
def test_regression_list_all_gather_extents_differ_by_array(c, pattern, check):
    """BUG (gather._many): sizes=None and one rank's arrays of different extents.

    Rank 1's second array is one row longer: the exchanged table is not
    uniform, so every rank must unpack array by array. ``gather._many``
    decides ``uniform`` from this rank's own shapes only (``_uniform``), so
    the ranks whose arrays all share a shape unpack the received bytes as a
    (k, sum(table[0]), ...) stack: a ValueError ("cannot reshape") with even
    extents, silently wrong results (array 1 one row short, later rows
    shifted) with uneven ones. Rank 1 is right. Fix: also require every
    array's row of the table to be the same (``all(t == table[0] for t in
    table)``) before taking the stacked route.
    """
    P, r = c.size, c.rank
    sizes = SIZE_PATTERNS[pattern](P)
    comm = hpccoll.Communicator(c.mpi, check=check)
    try:
        ys = [np.asarray(make((sizes[r] + (r == 1 and i == 1), 2), np.float32, seed=10 * r + i)) for i in range(3)]
        full = [
            np.concatenate([make((sizes[q] + (q == 1 and i == 1), 2), np.float32, seed=10 * q + i) for q in range(P)])
            for i in range(3)
        ]
        verdict = _each_array_alone(lambda: hpccoll.all_gather(ys, comm), lambda i: full[i], 3)
        agree(c, not verdict, verdict)
    finally:
        comm.free()


def _mixed_cases():
    cases = [
        ("all_reduce", "max", lambda r, P: [np.array([True, False, r == 1]), np.array([5, 0, 7 + r], np.uint8)]),
        ("all_reduce", "min", lambda r, P: [np.array([5, 0, 7 + r], np.uint8), np.array([True, r == 0, True])]),
        ("all_reduce", "max", lambda r, P: [np.asfortranarray(np.eye(2, dtype=bool)), np.array([5, r], np.uint8)]),
        ("reduce_scatter", "max", lambda r, P: [np.ones(2 * P, bool), np.full(2 * P, 5 + r, np.uint8)]),
        ("reduce_scatter", "min", lambda r, P: [np.ones(2 * P, bool), np.full((2 * P, 2), 5 + r, np.uint8)]),
    ]
    if ml_dtypes is not None:
        cases.append(
            ("all_reduce", "sum", lambda r, P: [np.array([1.5, r], np.float16), np.array([2.5, r], ml_dtypes.bfloat16)])
        )
    return cases


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", range(len(_mixed_cases())))
def test_regression_list_reductions_group_dtypes_by_plan(c, case):
    """BUG (reduce._many, scatter._many): dtypes that share a ReducePlan are packed as if they were one dtype.

    Both list reductions group arrays by ``reduce_plan(dtype, op)``; bool and
    uint8 under max/min (both ``ReducePlan(uint8, 'max'|'min')``), and float16
    with bfloat16 (both widened to float32), land in one group, and the
    one-group code then assumes one dtype:

    - ``reduce._unpacker`` (``_rows``: one shape, no out) returns every
      result as ``arrays[0].dtype``: ``all_reduce([bool, uint8], op='max')``
      gives the uint8 result as bool (values lost), ``[uint8, bool]`` the bool
      result as uint8;
    - ``concat``/``join`` into the scratch buffer with a non-C-contiguous
      first array concatenates into ``arrays[0].dtype`` and raises NumPy's
      TypeError (uint8 into bool);
    - ``all_reduce([float16, bfloat16])`` raises NumPy's DTypePromotionError
      from ``numpy.concatenate`` (not a DTypeError);
    - ``scatter._many``: ``_uniform`` ignores the dtype (uint8 result returned
      as bool), and ``_rank_major`` packs into ``arrays[idx[0]].dtype``, so
      uint8 values 5, 6 become True (1) and the max comes back as 1.

    Fix: group by (plan, dtype) -- or check one dtype in ``_rows``/``_uniform``
    and pack each array into the wire dtype.
    """
    name, op, arrays = _mixed_cases()[case]
    P, r = c.size, c.rank
    xs = arrays(r, P)
    fn = getattr(hpccoll, name)
    verdict = _each_array_alone(lambda: fn(xs, c, op=op), lambda i: fn(xs[i], c, op=op), len(xs))
    agree(c, not verdict, verdict)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("outs", ["all", "some"])
def test_regression_list_all_reduce_out(c, outs, async_op):
    """BUG (reduce._rows): a list all-reduce of one dtype with ``out=`` raises NumPy's ValueError.

    ``reduce._unpacker`` asks ``_rows(arrays, outs, plan)`` whether the
    results are the rows of one buffer; ``_rows`` computes
    ``outs.count(None)``, which compares every ``out`` array with ``None``
    elementwise: "The truth value of an array with more than one element is
    ambiguous", after the data moved, on every rank (1-element outs pass by
    luck). ``hpccoll.all_reduce([np.ones(3), np.ones(2)], out=[np.empty(3),
    np.empty(2)])`` fails, blocking or not, with or without the scratch route.
    Fix: ``all(o is None for o in outs)``.
    """
    P = c.size
    xs = [np.ones(3) * (c.rank + 1), np.ones(2) * (c.rank + 1)]
    given = [np.empty(3), np.empty(2)] if outs == "all" else [None, np.empty(2)]
    total = P * (P + 1) / 2
    try:
        got = hpccoll.all_reduce(xs, c, out=given, async_op=async_op)
        got = got.wait() if async_op else got
        verdict = "" if [g.tolist() for g in got] == [[total] * 3, [total] * 2] else f"got {got}"
    except Exception as e:  # noqa: BLE001 - reported on every rank together
        verdict = f"raised {type(e).__name__}: {e}"
    agree(c, not verdict, verdict)
