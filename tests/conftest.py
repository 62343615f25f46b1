"""Shared fixtures: the world communicator, data makers and a NumPy reference.

Every test is written for any number of ranks: the data is a *global* array
with a leading rank axis, made identically on every rank from a seed, and
each rank takes its slice. References are computed with NumPy from the
global array.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
import tiers

import hpccoll

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the test extra installs it
    ml_dtypes = None

# The float8 types reduce in float32, rounded once: their references are tests/test_float8.py's.
DTYPES = [np.dtype(n) for n in hpccoll.SUPPORTED_DTYPES if n != "bfloat16" and not n.startswith("float8")]
if ml_dtypes is not None:
    DTYPES.append(np.dtype(ml_dtypes.bfloat16))
DTYPE_IDS = [d.name for d in DTYPES]

#: Shard extents along the split axis, for any number of ranks P.
SIZE_PATTERNS = {
    "even": lambda p: [2] * p,
    "uneven": lambda p: [(3 * r + 2) % 4 for r in range(p)],  # 2,1,0,3: a rank with 0 from P=3
    "empty-last": lambda p: [r + 1 for r in range(p - 1)] + [0],
}


#: The seeds every rank must share, each from its variable or else drawn on rank 0: the GPU stand-in's random
#: mode (tests/standin_cupy.py) and hypothesis (tests/test_properties.py: every rank draws the same examples).
SEEDS = {"HPCCOLL_STANDIN_SEED": "GPU stand-in: random mode seed", "HPCCOLL_HYPOTHESIS_SEED": "hypothesis: seed"}


def pytest_configure(config):
    """Give every MPI rank its own tmp_path root, and every rank the same seeds (collective)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.size > 1 and not config.option.basetemp:
        config.option.basetemp = os.path.join(tempfile.gettempdir(), f"hpccoll-pytest-rank{world.rank}")
    seeds = {name: os.environ.get(name, "").strip() or str(int.from_bytes(os.urandom(4), "little")) for name in SEEDS}
    seeds = world.bcast(seeds, root=0)
    for name, seed in seeds.items():  # rank 0's values, so every rank raises alike
        if not seed.isdigit():
            raise pytest.UsageError(f"{name}: expected a non-negative int; got {seed!r}")
    os.environ.update(seeds)
    # A profile of `python -m hpccoll tune` in the developer's cache would change what auto and plans choose:
    # the suite runs on no profile unless a test names one.
    os.environ["HPCCOLL_TUNE_FILE"] = os.path.join(tempfile.gettempdir(), "hpccoll-tests-no-profile.json")
    name_the_test_when_killed(config, world)


# --------------------------------------------------------------------------- a run killed at its time limit

#: The node id of the test this process started last (PYTEST_CURRENT_TEST names the running one, and is unset
#: between tests).
_last_started = []


def pytest_runtest_logstart(nodeid, location):
    _last_started[:] = [nodeid]


#: The signals that end a run at its time limit: TERM, and USR2, which the Makefile's ``timeout`` sends under Open MPI
#: (its mpiexec passes USR2 on to the ranks and still forwards what they print; on TERM it aborts the job at once and
#: drops their output). MPICH's mpiexec passes TERM on. (USR1 is not ours: MPICH's ranks catch it themselves.)
LIMIT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def name_the_test_when_killed(config, world):
    """On SIGTERM (or SIGUSR2), say on this rank which test it was in, dump every thread's stack, end the jobs
    that the test started in sessions of their own, and exit with status 128 + the signal's number.

    The Makefile runs each suite under ``timeout``, which signals ``pytest`` (serial) or ``mpiexec``, which
    passes the signal on to every rank (each rank runs in a session or process group of its own). Python runs
    a signal handler only in the main thread, between bytecodes, so a rank blocked inside an MPI call (a hang
    in a collective) would never run it: the signal also wakes a thread of this module through
    :func:`signal.set_wakeup_fd`, and whichever of the two comes first reports. Without this a run killed at
    its limit ended with make's ``Error 124`` and no test named.
    """
    if threading.current_thread() is not threading.main_thread() or any(
        signal.getsignal(s) not in (signal.SIG_DFL, None) for s in LIMIT_SIGNALS
    ):
        return  # not ours to take: an embedding program handles these signals itself
    lock = threading.Lock()

    def report(signum, *_):
        if not lock.acquire(blocking=False):
            return  # the other path is reporting; it ends the process
        captured = ("", "")
        try:
            capman = config.pluginmanager.getplugin("capturemanager")
            if capman is not None:
                capman.suspend_global_capture(in_=True)  # fd 2 is the terminal (or make's log) again
                captured = capman.read_global_capture()  # what the test printed so far
        except Exception:  # noqa: BLE001 - report whatever the capture's state
            pass
        current = os.environ.get("PYTEST_CURRENT_TEST")
        where = (
            f"in {current}"
            if current
            else f"between tests, after {_last_started[0]}"
            if _last_started
            else "before the first test (collecting)"
        )
        os.write(
            2,
            f"\nKILLED by {signal.Signals(signum).name} (the run's time limit, make's TEST_TIMEOUT, or another kill) "
            f"on rank {world.rank} of {world.size}: {where}\n".encode(),
        )
        for name, text in zip(("stdout", "stderr"), captured):
            if text:
                os.write(2, f"--- its captured {name} (tail)\n{text[-2000:]}\n".encode(errors="replace"))
        try:
            faulthandler.dump_traceback(file=2, all_threads=True)
        except (OSError, ValueError):
            pass
        end_child_sessions()
        if world.size > 1:
            time.sleep(1)  # the other ranks got the signal too: let them say where they were before mpiexec ends them
        os._exit(128 + signum)

    read, write = os.pipe()
    os.set_blocking(write, False)
    for s in LIMIT_SIGNALS:
        signal.signal(s, report)
    theirs = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if theirs != -1:  # another user of the wakeup fd: give it back, and rely on the handler alone
        signal.set_wakeup_fd(theirs)
        os.close(read)
        os.close(write)
        return

    def watch():
        while True:
            got = os.read(read, 64)
            if not got:
                return
            for s in LIMIT_SIGNALS:
                if int(s) in got:
                    report(int(s))

    threading.Thread(target=watch, name="hpccoll kill reporter", daemon=True).start()


def end_child_sessions():
    """SIGTERM to the process group of each child that runs in a group of its own (``start_new_session``: the
    jobs tests/launch.py and the README test start), which the run's signal did not reach. Linux (/proc)."""
    me, group = os.getpid(), os.getpgrp()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
            ppid, pgrp = int(fields[1]), int(fields[2])
            if ppid == me and pgrp not in (group, 0):
                os.killpg(pgrp, signal.SIGTERM)
        except (OSError, IndexError, ValueError):
            continue


def pytest_report_header(config):
    """Print the seeds, so that a failure in random data can be repeated."""
    return [f"{what} {os.environ[name]} (repeat with {name}={os.environ[name]})" for name, what in SEEDS.items()]


@pytest.fixture(scope="session")
def comm():
    c = hpccoll.Communicator()
    yield c
    c.free()


def make(shape, dtype, seed, kind="any"):
    """Deterministic data of ``dtype`` from ``seed``.

    Floats are standard normal rounded to their own precision, 16-bit floats
    included: their sums round, so a reduction in 16 bits (instead of hpccoll's
    float32), a cast in the wrong place or a lost widening shows against the
    reference. ``kind='exact'``: multiples of 1/4 in [-2, 2), exact in every
    float type and so are sums of a few of them (for tests that compare
    16-bit reductions bit for bit).
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        return rng.integers(lo, 4, size=shape).astype(dtype)
    if kind == "exact":
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
    if op in ("land", "lor", "lxor"):  # MPI's logical ops: nonzero is true, the result 0/1 in the dtype
        return (
            {"land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}[op]
            .reduce(stack, axis=0)
            .astype(dtype)
        )
    if op in ("band", "bor", "bxor") and dtype.kind not in "biu":  # no meaning (hpccoll raises DTypeError)
        return np.zeros(stack.shape[1:], dtype)  # a placeholder that the sweeps never compare with
    if op in ("band", "bor", "bxor"):
        return {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op].reduce(
            stack, axis=0, dtype=dtype
        )
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
#: Unit roundoff of float32, the type hpccoll reduces 16-bit floats in (hpccoll._dtypes.reduce_plan).
U32 = 2.0**-24


def tolerance(dtype):
    """``rtol`` for comparing a reduction in ``dtype`` with the float64 reference (see :func:`assert_close`)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return 0.0
    if dtype.itemsize == 2:  # half a unit in the last place of each of the two rounded values
        return EPS16[dtype.name] / 2
    return {4: 2e-6, 8: 1e-13}[dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize]


def widening_error(stack, op, unit=None):
    """How far hpccoll's float32 reduction of 16-bit ``stack`` over its leading (rank) axis may be from the
    exact result before it is rounded back (elementwise; zeros for other dtypes and for max and min).

    Each of the P - 1 float32 additions rounds by at most ``U32`` of its partial sum, ``avg``'s division once
    more, and the reference's float64 -> bfloat16 cast goes through float32 (ml_dtypes): together at most
    ``gamma_P = P U32 / (1 - P U32)`` times the sum of the terms' magnitudes (over P for ``avg``; the
    product's magnitude for ``prod``). Under cancellation that can exceed a unit in the last place of the
    result. Pass it to :func:`assert_close` as ``slack`` (sliced like the reference).

    ``unit``: the unit roundoff of the type the transport adds in (default float32's, ``U32``); a
    transport that reduces 16-bit floats natively (NCCL) rounds every partial sum to the 16-bit type:
    pass ``EPS16[name] / 2``.
    """
    p = stack.shape[0]
    if stack.dtype.itemsize != 2 or stack.dtype.kind in "iu" or op in ("max", "min"):
        return np.zeros(stack.shape[1:])
    u = U32 if unit is None else unit
    gamma = p * u / (1 - p * u)
    wide = np.abs(stack.astype(np.float64))
    if op == "prod":
        return gamma * wide.prod(axis=0)
    return gamma * wide.sum(axis=0) / (p if op == "avg" else 1)


def assert_close(got, want, comm=None, *, slack=0.0):
    """Compare a reduction with its float64 reference: exact for bool and integers, else by tolerance.

    A 16-bit result ``g`` is hpccoll's float32 result rounded once, the
    reference ``w`` the exact result rounded once; so ``|g - w| <= u (|g| +
    |w|) + tiny + slack`` with ``u`` half the machine epsilon (one rounding
    each), ``tiny`` the subnormal spacing and ``slack`` the float32 reduction's
    own error (:func:`widening_error`; 0 by default: a sum of a few standard
    normal 16-bit values is almost always exact in float32). In practice ``g``
    equals ``w`` or is its neighbour. Wider floats, whose test data are O(1),
    with ``rtol = atol`` (the reference is computed in their own dtype).

    With ``comm`` the verdict is collective (see :func:`agree`).
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    if comm is not None:
        return agree(comm, lambda: assert_close(got, want, slack=slack))
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    rtol = tolerance(want.dtype)
    if rtol == 0.0:
        np.testing.assert_array_equal(got, want)
        return True
    wide = np.complex128 if want.dtype.kind == "c" else np.float64
    g, w = got.astype(wide), want.astype(wide)
    if want.dtype.itemsize == 2:
        bound = rtol * (np.abs(g) + np.abs(w)) + TINY16[want.dtype.name] + slack
        bad = ~((np.abs(g - w) <= bound) | (np.isnan(g) & np.isnan(w)) | (g == w))
        assert not bad.any(), (
            f"{int(bad.sum())} of {bad.size} {want.dtype} values differ by more than a unit in the last place "
            f"(+ slack): got {g[bad][:5]}, want {w[bad][:5]}, bound {np.broadcast_to(bound, bad.shape)[bad][:5]}"
        )
    else:
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
    return True


def assert_same(got, want, comm=None):
    """Exact comparison for pure data movement: same dtype, shape and bits (collective with ``comm``)."""
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    if comm is not None:
        return agree(comm, lambda: assert_same(got, want))
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(
        got.view(f"u{got.dtype.itemsize}") if got.dtype.itemsize <= 8 else got,
        want.view(f"u{want.dtype.itemsize}") if want.dtype.itemsize <= 8 else want,
    )
    return True


def agree(comm, ok, message=""):
    """Check on every rank together: fail on every rank at once when ``ok`` fails on any (collective).

    A plain ``assert`` failing on one rank leaves the other ranks waiting in
    the next collective until the job is killed; every rank calls this
    instead, passing or not, and each raises the same ``AssertionError``,
    naming every failing rank with its message.

    Parameters
    ----------
    comm : hpccoll.Communicator or mpi4py.MPI.Intracomm
    ok : bool or callable
        The verdict, or a check to run: it fails by raising (any exception:
        its message is the rank's message) or by returning False.
    message : str or callable
        What failed on this rank (a callable is called only on failure).

    Returns
    -------
    True, on every rank, when ``ok`` holds everywhere.
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    try:
        if callable(ok):
            ok = ok()
            ok = ok is None or bool(ok)
        mine = None if ok else (message() if callable(message) else message) or "check failed"
    except Exception as exc:  # noqa: BLE001 - this rank's failure, shared below
        mine = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    everyone = getattr(comm, "mpi", comm).allgather(None if mine is None else str(mine)[:3000])
    failed = [f"rank {r}: {m}" for r, m in enumerate(everyone) if m is not None]
    if failed:
        raise AssertionError(f"failed on {len(failed)} of {len(everyone)} ranks:\n" + "\n".join(failed))
    return True


#: The older name of :func:`agree` (``assert all_ranks(comm, ok)``), kept for the files that still use it.
all_ranks = agree


def pytest_terminal_summary(terminalreporter):
    """Say when the GPU tests were skipped, so they cannot vanish silently from every job."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "gpu" in getattr(r, "keywords", {})]
    if skipped:
        terminalreporter.write_sep(
            "=",
            f"{len(skipped)} GPU tests (marker gpu) skipped, reasons above; on a GPU machine: make test-gpu",
            yellow=True,
        )


def raises_everywhere(comm, exc, match, call, *, same_message=True):
    """``call()`` raises ``exc`` (its message matching the regex ``match``, unless None) on every rank: checked
    with :func:`agree`.

    A rank that returns or raises something else fails the test on every rank
    instead of leaving the others waiting. ``same_message``: the message is
    also the same on every rank (say False where it names the rank).
    Returns this rank's message.
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    seen = []

    def check():
        with pytest.raises(exc, match=match) as info:
            call()
        seen.append(str(info.value))

    agree(comm, check)
    if same_message:
        everyone = getattr(comm, "mpi", comm).allgather(seen[0])
        assert len(set(everyone)) == 1, f"the message differs between ranks: {everyone}"  # the same verdict everywhere
    return seen[0]


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=tiers.TIERS,
        default="all",
        help="quick: what `make test` runs (every collective, adjoint, transport and adapter; each parameter value "
        "once); rest: what quick leaves out; all (default): both (tests/tiers.py)",
    )


#: The tier of every collected item, for tests/test_tiers.py: {"items": all collected, "quick": the quick tier's,
#: "skipped": the test files that skipped as a whole when collected (e.g. test_conformance.py without the real CuPy)}.
TIER_KEY = pytest.StashKey[dict]()

#: The names of the test files whose collection skipped (pytest_collectreport), read into TIER_KEY's "skipped".
_skipped_files: set = set()


def pytest_collectreport(report):
    if report.skipped and report.nodeid.endswith(".py"):
        _skipped_files.add(os.path.basename(report.nodeid))


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: the tiers are chosen from the whole collection
def pytest_collection_modifyitems(config, items):
    """Keep the ``--tier`` asked for (tests/tiers.py); and ``large`` tests (messages over 2^31 elements, many GiB)
    run only with HPCCOLL_TEST_LARGE=1 (make test-large), each with up to 25 minutes (setup.cfg's per-test timeout
    is for everything else).

    Both decisions depend on the collection and the environment only, so they are the same on every rank.
    """
    from hpccoll._settings import flag

    tier = config.getoption("tier")
    from mpi4py import MPI

    quick = tiers.quick_tier(items, MPI.COMM_WORLD.size)
    config.stash[TIER_KEY] = {"items": list(items), "quick": quick, "skipped": set(_skipped_files)}
    if tier != "all":
        keep = {id(item) for item in quick}
        chosen = [item for item in items if (id(item) in keep) == (tier == "quick")]
        config.hook.pytest_deselected(items=[item for item in items if (id(item) in keep) != (tier == "quick")])
        items[:] = chosen

    large = [item for item in items if "large" in item.keywords]
    if flag("HPCCOLL_TEST_LARGE", os.environ.get("HPCCOLL_TEST_LARGE", "").strip()):
        for item in large:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(1500))
        return
    skip = pytest.mark.skip(reason="large: set HPCCOLL_TEST_LARGE=1 (make test-large) to run")
    for item in large:
        item.add_marker(skip)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's thread method (setup.cfg), saying first which test on which rank ran out of time.

    ``-q`` prints no test names, and the stacks that pytest-timeout dumps name
    functions, not parametrizations. Then pytest-timeout dumps the stacks and
    ends this process, and mpiexec ends the other ranks, instead of the job
    hanging in a collective until the Makefile's ``timeout`` kills it unnamed.
    """
    if settings.method != "thread":
        return None
    import pytest_timeout
    from mpi4py import MPI

    world = MPI.COMM_WORLD

    def expire():
        capman = item.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(item)
        terminal = item.config.get_terminal_writer()
        terminal.line(
            f"\nTIMEOUT on rank {world.rank} of {world.size}: {item.nodeid} ran past its {settings.timeout:g} s "
            "(its stacks follow; the job ends)",
            red=True,
            bold=True,
        )
        terminal.flush()
        pytest_timeout.timeout_timer(item, settings)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"pytest-timeout {item.nodeid}"
    timer.daemon = True

    def cancel():
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel
    timer.start()
    return True


class Verdict:
    """Collects this rank's failed comparisons; on leaving the block, one collective verdict (:func:`agree`).

    Every rank runs the same collectives whatever its comparisons say, so a wrong value on one rank fails
    the test on every rank instead of leaving the others waiting.
    """

    def __init__(self, comm):
        self.comm = comm
        self.errors = []

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None and not issubclass(kind, AssertionError):
            return False  # an exception from hpccoll: let it propagate
        if kind is not None:
            self.errors.append(f"{value}")
        agree(self.comm, not self.errors, lambda: "\n".join(self.errors[:12]))
        return True

    def _run(self, what, check):
        try:
            check()
        except AssertionError as exc:
            self.errors.append(f"{what}: {exc}"[:1500])

    def same(self, got, want, what):
        self._run(what, lambda: assert_same(np.asarray(got), want))

    def close(self, got, want, what, slack=0.0):
        if np.dtype(want.dtype).kind in "biu":  # integers and bools compare exactly
            return self.same(got, want, what)
        self._run(what, lambda: assert_close(np.asarray(got), want, slack=slack))

    def true(self, ok, what):
        if not ok:
            self.errors.append(what)
