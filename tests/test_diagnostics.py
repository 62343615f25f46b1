"""Diagnostics: ``Communicator.explain`` against what the collectives really do, and ``HPCCOLL_DEBUG``'s records.

``explain`` is checked call by call against a trace of the collective made
right after it on the same communicator: the transports ``transport_of``
answered, the transport whose primitive moved each message (the selector
sends the sizes ``shm`` does not win to ``mpi``; no primitive hands a message
on), the wire dtype
the primitive received and, for lists, the number and sizes of the messages.
"""

import contextlib
import logging
import sys
import textwrap

import numpy as np
import pytest
from conftest import agree
from launch import run_mpiexec
from mpi4py import MPI

import hpccoll
from hpccoll import _log
from hpccoll._comm import Communicator
from hpccoll.transports.host_mpi import HostMPI
from hpccoll.transports.shm import SharedMemory

serial_only = pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")

PRIMITIVES = ("allgatherv", "reduce_scatter", "allreduce", "sendrecv")


class Trace:
    """What a collective did: the transports ``transport_of`` returned, and one chain of calls per message."""

    def __init__(self):
        self.chosen = []
        self.messages = []  # per top-level primitive call: [(transport name, primitive, send, recv), ...]
        self.depth = 0


@contextlib.contextmanager
def traced():
    """Record ``transport_of``'s answers and the (nested) primitive calls of the host and shm transports."""
    t = Trace()
    real_of = Communicator.transport_of

    def transport_of(self, kind, nbytes=0, primitive=None, blocking=True):
        inst = real_of(self, kind, nbytes, primitive, blocking)
        t.chosen.append(inst.name)
        return inst

    def wrap(cls, name):
        real = getattr(cls, name)

        def call(self, send, recv, *rest):
            if t.depth == 0:
                t.messages.append([])
            t.messages[-1].append((self.name, name, send, recv))
            t.depth += 1
            try:
                return real(self, send, recv, *rest)
            finally:
                t.depth -= 1

        return call

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Communicator, "transport_of", transport_of)
        for cls in (HostMPI, SharedMemory):
            for name in PRIMITIVES:
                m.setattr(cls, name, wrap(cls, name))
        yield t


def rng_for(c):
    return np.random.default_rng(17 + c.rank)


#: (collective, make x from (communicator, rng), keyword arguments, bucket_bytes or None)
CASES = {
    "all_reduce-small": ("all_reduce", lambda c, g: g.standard_normal(5), {}, None),
    "all_reduce-shm": ("all_reduce", lambda c, g: g.standard_normal(1 << 16), {}, None),
    "all_reduce-float16-widened": ("all_reduce", lambda c, g: g.standard_normal(300).astype("f2"), {}, None),
    # 192 KiB of float16, 384 KiB on the wire: below shm's threshold, its widened message above it
    "all_reduce-float16-widened-shm": (
        "all_reduce",
        lambda c, g: g.standard_normal(96 << 10).astype("f2"),
        {},
        None,
    ),
    "all_reduce-int8-sum": ("all_reduce", lambda c, g: g.integers(-3, 3, 40).astype("i1"), {}, None),
    "all_reduce-bool-prod": ("all_reduce", lambda c, g: g.integers(0, 2, 9).astype(bool), {"op": "prod"}, None),
    "all_reduce-avg": ("all_reduce", lambda c, g: g.standard_normal((3, 4)).astype("f4"), {"op": "avg"}, None),
    "reduce_scatter": ("reduce_scatter", lambda c, g: g.standard_normal((2 * c.size + 1, 3)), {}, None),
    "reduce_scatter-shm": ("reduce_scatter", lambda c, g: g.standard_normal((c.size << 17,)), {}, None),
    "all_gather-exchanged": ("all_gather", lambda c, g: g.standard_normal((3, c.rank + 1)), {"axis": 1}, None),
    "all_gather-sizes": (
        "all_gather",
        lambda c, g: g.standard_normal((c.rank + 2, 2)).astype("f2"),
        {"sizes": "rank+2"},
        None,
    ),
    "all_gather-shm": ("all_gather", lambda c, g: g.standard_normal(((1 << 18) // c.size,)), {}, None),
    "list-all_reduce-buckets": (
        "all_reduce",
        lambda c, g: [g.standard_normal(100), g.standard_normal(100).astype("f4"), g.standard_normal(600)],
        {},
        2000,
    ),
    "list-all_reduce-shm-hands-buckets-to-mpi": (  # 512 KiB in all: shm; buckets of 128 KiB: below its 256 KiB
        "all_reduce",
        lambda c, g: [g.standard_normal(1 << 14) for _ in range(4)],
        {},
        1 << 17,
    ),
    "all_gather-shm-hands-to-mpi": ("all_gather", lambda c, g: g.standard_normal(((1 << 20) // c.size,)), {}, None),
    "list-all_reduce-one-bucket": ("all_reduce", lambda c, g: [g.standard_normal(7) for _ in range(4)], {}, None),
    "list-reduce_scatter-buckets": (
        "reduce_scatter",
        lambda c, g: [g.standard_normal(4 * c.size).astype("f2"), g.standard_normal(30 * c.size)],
        {},
        300,
    ),
    "list-all_gather-buckets": (
        "all_gather",
        lambda c, g: [g.standard_normal((c.rank + 1, 5)), g.integers(0, 9, 50), g.standard_normal(3).astype("f4")],
        {},
        250,
    ),
}


def _call(collective, x, c, kw):
    return getattr(hpccoll, collective)(x, c, **kw)


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_explain_says_what_the_collective_does(case):
    """explain's transport, mover, wire dtypes and buckets are those of the call that follows it."""
    collective, make, kw, bucket_bytes = CASES[case]
    with hpccoll.Communicator() as c:
        if bucket_bytes:
            c.bucket_bytes = bucket_bytes
        kw = dict(kw)
        if kw.get("sizes") == "rank+2":
            kw["sizes"] = [r + 2 for r in range(c.size)]
        x = make(c, rng_for(c))
        e = c.explain(x, collective, **kw)
        with traced() as t:
            _call(collective, x, c, kw)
        many = isinstance(x, list)
        arrays = x if many else [x]

        def check():
            assert e.collective == collective and e.kind == "numpy"
            if c.size == 1:  # a local copy: no transport, no plan, no buckets
                assert (e.transport, e.moved_by, e.plans, e.buckets) == (None, (), {}, None), e
                assert t.chosen == [] and t.messages == [], (t.chosen, t.messages)
                return
            movers = tuple(dict.fromkeys(chain[-1][0] for chain in t.messages))
            assert movers == e.moved_by, (movers, e)
            # the communicator's selector names the transport that moves each message: none is handed on
            assert all(len(chain) == 1 for chain in t.messages), t.messages
            assert set(movers) <= set(t.chosen) <= set(movers) | {e.transport}, (t.chosen, e)
            # the dtype each message travels in: the plan's wire dtype (reductions), the movement dtype (gathers)
            recv_dtypes = {chain[-1][3].dtype for chain in t.messages}
            if collective == "all_gather":
                want = {np.dtype(e.moves_as[a.dtype.name]) for a in arrays}
            else:
                want = {e.plans[a.dtype.name].wire for a in arrays}
            assert recv_dtypes == want, (recv_dtypes, e)
            if not many:
                assert e.buckets is None and len(t.messages) == 1, (e, t.messages)
                return
            sizes = []
            for chain in t.messages:
                _, primitive, send, recv = chain[0]
                sizes.append((send if primitive == "reduce_scatter" else recv).nbytes)
            assert sizes == [b.nbytes for b in e.buckets], (sizes, e.buckets)
            assert [b.moved_by for b in e.buckets] == [chain[-1][0] for chain in t.messages]
            assert sorted(i for b in e.buckets for i in b.arrays) == list(range(len(arrays))), e.buckets

        agree(c, check)
        if bucket_bytes and c.size > 1:
            agree(c, len(e.buckets) > 1, f"expected several buckets: {e.buckets}")  # the case tests a split


@pytest.mark.mpi
@pytest.mark.parametrize(
    "make",
    [
        lambda g: g.standard_normal(5),
        lambda g: g.standard_normal(1 << 16),  # 512 KiB
        lambda g: [g.standard_normal(3).astype("f4"), np.empty(0), g.integers(0, 9, (4, 2))],
    ],
    ids=["small", "512KiB", "list"],
)
def test_explain_shift(make):
    """explain(x, "shift"): the transport and movers of the call that follows, one message per non-empty array."""
    with hpccoll.Communicator() as c:
        x = make(rng_for(c))
        e = c.explain(x, "shift")
        with traced() as t:
            hpccoll.shift(x, c)
        many = isinstance(x, list)
        arrays = x if many else [x]

        def check():
            assert e.collective == "shift" and e.nbytes == sum(a.nbytes for a in arrays) and e.plans == {}, e
            if c.size == 1:
                assert (e.transport, e.moved_by, e.buckets) == (None, (), None), e
                return
            assert set(t.chosen) == {e.transport}, (t.chosen, e)
            assert [chain[0][:2] for chain in t.messages] == [(e.transport, "sendrecv")], t.messages
            assert tuple(dict.fromkeys(chain[-1][0] for chain in t.messages)) == e.moved_by, (t.messages, e)
            assert e.moves_as == {a.dtype.name: "uint8" for a in arrays}, e
            sent = [buf.nbytes for buf, _ in t.messages[0][0][2]]
            if many:
                assert [b.nbytes for b in e.buckets] == sent, (e.buckets, sent)
                assert [b.arrays for b in e.buckets] == [(i,) for i, a in enumerate(arrays) if a.size], e.buckets
            else:
                assert e.buckets is None and sent == [x.nbytes], (e, sent)

        agree(c, check)


@pytest.mark.mpi
def test_explain_reports_widening_and_why():
    """float16 sums widen to float32 on host transports; avg divides; the notes say so."""
    with hpccoll.Communicator() as c:
        e = c.explain(np.ones(8, "f2"), op="avg")

        def check():
            if c.size == 1:
                assert e.plans == {} and any("one rank" in n for n in e.notes), e
                return
            plan = e.plans["float16"]
            assert (plan.wire, plan.op, plan.widen, plan.divide) == (np.dtype("f4"), "sum", True, True), plan
            assert any("widened to float32" in n for n in e.notes) and any("avg" in n for n in e.notes), e.notes

        agree(c, check)


@pytest.mark.mpi
def test_explain_says_when_it_communicates(monkeypatch):
    """The size exchange of all_gather(sizes=None) communicates, every time; known sizes and reductions do not
    (under ``auto``: a named shm sets up the node's memory at its first use)."""
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    with hpccoll.Communicator() as c:
        first = c.explain(np.ones(3))  # the first choice for NumPy arrays: local (no probe below shm's threshold)
        gathered = c.explain(np.ones((2, 3)), "all_gather")
        known = c.explain(np.ones((2, 3)), "all_gather", sizes=[2] * c.size)
        again = c.explain(np.ones((2, 3)), "all_gather")

        def check():
            assert not first.communicated and not first.size_exchange, first
            several = c.size > 1
            assert (gathered.size_exchange, gathered.communicated) == (several, several), gathered
            assert (again.size_exchange, again.communicated) == (several, several), again
            assert not known.size_exchange and not known.communicated, known
            assert gathered.nbytes == known.nbytes == 2 * c.size * 3 * 8, (gathered, known)

        agree(c, check)


@pytest.mark.mpi
def test_explain_refuses_what_the_collective_refuses():
    with hpccoll.Communicator() as c:
        with pytest.raises(hpccoll.ArgumentError, match="collective: expected one of 'all_reduce'"):
            c.explain(np.ones(2), "broadcast")
        with pytest.raises(hpccoll.DTypeError, match="op='avg': expected a floating or complex dtype"):
            c.explain(np.ones(2, "i4"), op="avg")
        with pytest.raises(hpccoll.ArgumentError, match="axis: expected an int in"):
            c.explain(np.ones(2), "all_gather", axis=3, sizes=[2] * c.size)
        with pytest.raises(hpccoll.ArgumentError, match=f"sizes: expected {c.size} non-negative ints"):
            c.explain(np.ones(2), "all_gather", sizes=[2] * (c.size + 1))
        with pytest.raises(hpccoll.ArgumentError, match="sizes: expected"):
            c.explain(np.ones(2), "all_gather", sizes=["two"] * c.size)


# --------------------------------------------------------------------------- logging


@pytest.fixture
def fresh_logger():
    """The ``hpccoll`` logger as an unconfigured process has it, restored afterwards."""
    log = _log.logger
    saved = (list(log.handlers), log.level, log.propagate, list(_log._CONFIGURED))
    for h in list(log.handlers):
        log.removeHandler(h)
    log.setLevel(logging.NOTSET)
    log.propagate = True
    _log._CONFIGURED.clear()
    yield log
    for h in list(log.handlers):
        log.removeHandler(h)
    handlers, level, propagate, configured = saved
    for h in handlers:
        log.addHandler(h)
    log.setLevel(level)
    log.propagate = propagate
    _log._CONFIGURED[:] = configured


@pytest.mark.mpi
def test_debug_adds_a_rank_prefixed_handler_once(fresh_logger, monkeypatch):
    monkeypatch.setenv("HPCCOLL_DEBUG", "1")
    handler = _log.configure()
    assert handler is not None and fresh_logger.handlers == [handler] and fresh_logger.level == logging.DEBUG
    assert not fresh_logger.propagate
    assert _log.configure() is None and fresh_logger.handlers == [handler]  # once per process
    record = logging.LogRecord("hpccoll.exchange", logging.DEBUG, __file__, 1, "extents %s", ([1, 2],), None)
    world = MPI.COMM_WORLD
    want = f"hpccoll[rank {world.rank}/{world.size}] DEBUG exchange: extents [1, 2]"
    assert handler.formatter.format(record) == want


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["handler", "level"])
def test_debug_leaves_a_logger_the_user_configured_alone(fresh_logger, monkeypatch, how):
    monkeypatch.setenv("HPCCOLL_DEBUG", "1")
    mine = logging.NullHandler()
    if how == "handler":
        fresh_logger.addHandler(mine)
    else:
        fresh_logger.setLevel(logging.INFO)
    assert _log.configure() is None
    assert fresh_logger.handlers == ([mine] if how == "handler" else [])
    assert fresh_logger.level == (logging.NOTSET if how == "handler" else logging.INFO)


@pytest.mark.mpi
@pytest.mark.parametrize("raw", ["", "0", "off"])
def test_no_debug_no_handler(fresh_logger, monkeypatch, raw):
    monkeypatch.setenv("HPCCOLL_DEBUG", raw)
    assert _log.configure() is None and fresh_logger.handlers == [] and fresh_logger.level == logging.NOTSET


@pytest.mark.mpi
def test_bad_debug_value_is_refused_before_any_communication(fresh_logger, monkeypatch):
    monkeypatch.setenv("HPCCOLL_DEBUG", "loud")
    with pytest.raises(hpccoll.ArgumentError, match="HPCCOLL_DEBUG: expected 1/true/yes/on or 0/false/no/off"):
        hpccoll.Communicator()


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.mpi
def test_records_name_the_choice_the_exchange_and_the_split(fresh_logger):
    """A user's own handler on the ``hpccoll`` logger gets the records (HPCCOLL_DEBUG not needed)."""
    seen = Records()
    fresh_logger.addHandler(seen)
    fresh_logger.setLevel(logging.DEBUG)
    with hpccoll.Communicator() as c:
        c.bucket_bytes = 100
        hpccoll.all_gather(np.ones((2, c.rank + 1)), c, axis=1)
        hpccoll.all_reduce([np.ones(10), np.ones(10)], c)
        said = [(r.name, r.getMessage()) for r in seen.records]

        def check():
            topics = [name for name, _ in said]
            exchange = [m for name, m in said if name == "hpccoll.exchange"]
            assert len(exchange) == 1 and f"[{list(range(1, c.size + 1))}]" in exchange[0], exchange
            if c.size == 1:  # one rank: the sizes are still exchanged, but no transport moves anything
                assert topics == ["hpccoll.exchange"], said
                return
            assert topics.count("hpccoll.transport") == 1, said
            assert "NumPy arrays" in dict(said)["hpccoll.transport"], said
            split = [m for name, m in said if name == "hpccoll.buckets"]
            want = "2 arrays (160 bytes) split into 2 buckets of at most 100 bytes (bucket_bytes); [start, stop) of each: [[0, 1], [1, 2]]"
            assert split == [want], split

        agree(c, check)


DEBUG_JOB = """
    import numpy as np
    import hpccoll
    comm = hpccoll.Communicator()
    comm.bucket_bytes = 64
    hpccoll.all_gather(np.ones(comm.rank + 1), comm)
    hpccoll.all_reduce([np.ones(8), np.ones(8)], comm)
    print("done", flush=True)
"""


@serial_only
@pytest.mark.parametrize("debug", ["1", None], ids=["HPCCOLL_DEBUG=1", "unset"])
def test_debug_records_on_stderr_with_every_rank(debug):
    """Launched at 2 ranks: each rank's records on stderr, prefixed with its rank; nothing without the variable."""
    env = {"HPCCOLL_DEBUG": debug} if debug else {}
    proc = run_mpiexec(
        2, [sys.executable, "-m", "mpi4py", "-c", textwrap.dedent(DEBUG_JOB)], env=env, drop=("HPCCOLL_",), timeout=120
    )
    lines = proc.stderr.splitlines()
    assert proc.stdout.count("done") == 2, proc.stdout
    if not debug:
        assert not any(line.startswith("hpccoll[") for line in lines), proc.stderr
        return
    for rank in (0, 1):
        tag = f"hpccoll[rank {rank}/2] DEBUG "
        mine = [line[len(tag) :] for line in lines if line.startswith(tag)]
        assert any(m.startswith("transport: NumPy arrays on a 2-rank communicator") for m in mine), proc.stderr
        assert "exchange: all_gather: exchanged the extents of 1 array(s) along axes [0] over 2 ranks" in "\n".join(
            mine
        ), proc.stderr
        assert any(m.startswith("buckets: 2 arrays (128 bytes) split into 2 buckets") for m in mine), proc.stderr
