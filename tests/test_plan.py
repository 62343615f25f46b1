"""Planned collectives (hpccoll.plan): every collective and adjoint, called again and again, against the
unplanned call on the same inputs; the plan's lifecycle, its cross-rank agreement, its choice of method and
the profile of ``python -m hpccoll tune``.

Each case makes a plan once, then for three rounds writes new values into the planned input and compares
the plan's result with the collective called afresh on a copy: a plan that replayed stale buffers (a packed
copy of the first input) or skipped a step (avg's divide, a non-root's zeros) fails here. Comparisons are
collective (:class:`conftest.Verdict`), so a wrong value on one rank fails the test on every rank.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import Verdict, agree, make, raises_everywhere

import hpccoll
from hpccoll import ArgumentError, HpccollError, MismatchError

pytestmark = pytest.mark.mpi


def _sizes(p):
    return [(3 * r + 2) % 4 for r in range(p)]  # uneven, a rank with 0 from P=3


# name, function, options(P), this rank's input shape(P, r), dtype
CASES = {
    "all_reduce": (hpccoll.all_reduce, lambda p: {}, lambda p, r: (5,), np.float64),
    "all_reduce-int-max": (hpccoll.all_reduce, lambda p: {"op": "max"}, lambda p, r: (3, 4), np.int32),
    "all_reduce-avg": (hpccoll.all_reduce, lambda p: {"op": "avg"}, lambda p, r: (6,), np.float64),
    "all_reduce-f16": (hpccoll.all_reduce, lambda p: {}, lambda p, r: (4,), np.float16),
    "all_reduce-0d": (hpccoll.all_reduce, lambda p: {}, lambda p, r: (), np.float64),
    "all_reduce_adjoint": (hpccoll.all_reduce_adjoint, lambda p: {}, lambda p, r: (5,), np.float64),
    "all_gather": (hpccoll.all_gather, lambda p: {}, lambda p, r: (r + 1, 3), np.float64),
    "all_gather-axis1": (hpccoll.all_gather, lambda p: {"axis": 1}, lambda p, r: (2, _sizes(p)[r]), np.int64),
    "all_gather_adjoint": (
        hpccoll.all_gather_adjoint,
        lambda p: {"sizes": _sizes(p)},
        lambda p, r: (sum(_sizes(p)), 2),
        np.float64,
    ),
    "reduce_scatter": (
        hpccoll.reduce_scatter,
        lambda p: {"sizes": _sizes(p)},
        lambda p, r: (sum(_sizes(p)), 3),
        np.float64,
    ),
    "reduce_scatter-even": (hpccoll.reduce_scatter, lambda p: {}, lambda p, r: (2 * p,), np.int64),
    "reduce_scatter_adjoint": (hpccoll.reduce_scatter_adjoint, lambda p: {}, lambda p, r: (2, 3), np.float64),
    "all_to_all": (hpccoll.all_to_all, lambda p: {}, lambda p, r: (2 * p, 3), np.float64),
    "all_to_all_adjoint": (hpccoll.all_to_all_adjoint, lambda p: {}, lambda p, r: (2 * p,), np.int32),
    "broadcast": (hpccoll.broadcast, lambda p: {"root": p - 1}, lambda p, r: (4, 2), np.float64),
    "broadcast_adjoint": (hpccoll.broadcast_adjoint, lambda p: {}, lambda p, r: (5,), np.float64),
    "reduce": (hpccoll.reduce, lambda p: {"root": p // 2}, lambda p, r: (5,), np.float64),
    "reduce-avg": (hpccoll.reduce, lambda p: {"op": "avg"}, lambda p, r: (4,), np.float64),
    "reduce_adjoint": (hpccoll.reduce_adjoint, lambda p: {}, lambda p, r: (3,), np.float64),
    "gather": (hpccoll.gather, lambda p: {"root": 0}, lambda p, r: (r + 1, 2), np.float64),
    "gather_adjoint": (
        hpccoll.gather_adjoint,
        lambda p: {"sizes": _sizes(p)},
        lambda p, r: (sum(_sizes(p)) if r == 0 else 0, 2),
        np.float64,
    ),
    "scatter": (
        hpccoll.scatter,
        lambda p: {"root": p - 1},
        lambda p, r: (3 * p + 1 if r == p - 1 else 0, 2),
        np.float64,
    ),
    "scatter_adjoint": (hpccoll.scatter_adjoint, lambda p: {}, lambda p, r: (r + 1,), np.float64),
}


def _fill(x, seed):
    """New values in ``x`` (in place), the same on no two ranks."""
    x[...] = make(x.shape, x.dtype, seed)


def _check(v, got, want, what):
    if want.dtype.kind == "f":
        v._run(what, lambda: np.testing.assert_allclose(got, want, rtol=1e-3 if want.itemsize == 2 else 1e-12))
    else:
        v.same(got, want, what)


def _rounds(comm, plan, x, fresh, v, in_place=False, rounds=3):
    """Three rounds of new input: the plan's result against ``fresh(copy)``; the same result object each time."""
    first = None
    for k in range(rounds):
        _fill(x, 100 * k + 7 * comm.rank + 1)
        before = x.copy()
        want = fresh(before.copy())
        got = plan()
        if first is None:
            first = got
        v._run(f"round {k}: the same result object", lambda: _is_same(got, first))
        if in_place:
            v._run(f"round {k}: in place", lambda: _is_same(got, x))
        else:
            v.same(x, before, f"round {k}: x untouched")
        _check(v, got, want, f"round {k}")


def _is_same(a, b):
    assert a is b, "a different object"


@pytest.mark.parametrize("method", ["auto", "persistent", "blocking"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_the_call(comm, case, method):
    fn, options, shape, dtype = CASES[case]
    p, r = comm.size, comm.rank
    opts = options(p)
    x = np.zeros(shape(p, r), dtype)
    with Verdict(comm) as v, hpccoll.plan(fn, x, comm, method=method, **opts) as planned:
        _rounds(comm, planned, x, lambda a: fn(a, comm, **opts), v)
        if persistent(comm) and method == "persistent" and case in ("all_reduce", "all_gather", "broadcast"):
            v._run("replayed as persistent requests", lambda: _eq(planned.methods, ("persistent",)))


@pytest.mark.parametrize("fn", [hpccoll.all_reduce, hpccoll.all_gather, hpccoll.all_to_all])
def test_plan_runs_the_call_alone(comm, fn):
    # A result received straight into out leaves nothing to finish: the plan runs the transport call's
    # steps and returns (all_to_all's recorded run once had a finishing step that only returned out).
    x = np.zeros(2 * comm.size)
    with Verdict(comm) as v, hpccoll.plan(fn, x, comm, method="persistent") as planned:
        if persistent(comm):
            v._run("steps alone", lambda: _eq("second" in planned.func.__code__.co_freevars, True))


@pytest.mark.parametrize("fn", [hpccoll.all_gather, hpccoll.broadcast, hpccoll.all_to_all])
def test_plan_through_shm_prepares_host_mpi(comm, fn):
    # 1 MiB on the default communicator: auto offers it to shm, which leaves these calls to host MPI (no
    # shm all-gather, broadcast or all-to-all without a profile): the plan prepares host MPI's call.
    c = hpccoll.Communicator(comm.mpi)
    x = np.ones((1 << 17) // comm.size * comm.size)  # 1 MiB, split evenly
    with Verdict(comm) as v, hpccoll.plan(fn, x, c, method="persistent") as planned:
        for k in range(2):
            x[...] = k + comm.rank
            got = planned().copy()
            v.same(got, fn(x.copy(), c), f"round {k}")
        if persistent(comm) and c.transport_of("numpy", x.nbytes * comm.size).name == "shm":
            v._run("host MPI's persistent request", lambda: _eq(planned.methods, ("persistent",)))
    c.free()


def persistent(c):
    """Whether plans on ``c`` can use MPI persistent collectives: more than one rank, host MPI moving its small
    NumPy messages (not a transport named instead: ``HPCCOLL_TRANSPORT=shm`` moves every call itself, in one
    form), an MPI that has them."""
    return c.size > 1 and c.transport_of("numpy").name == "mpi" and c.transport_instance("mpi").persistent


def _eq(got, want):
    assert got == want, (got, want)


@pytest.mark.parametrize("case", ["all_reduce", "all_reduce-avg", "broadcast", "reduce", "reduce_scatter-even"])
def test_plan_in_place(comm, case):
    fn, options, shape, dtype = CASES[case]
    opts = options(comm.size)
    x = np.zeros(shape(comm.size, comm.rank), dtype)
    if case == "reduce_scatter-even":  # in place: out is this rank's block of x
        block = x.shape[0] // comm.size
        out = x[comm.rank * block : (comm.rank + 1) * block]
    else:
        out = x
    with Verdict(comm) as v, hpccoll.plan(fn, x, comm, out=out, **opts) as planned:
        for k in range(3):
            _fill(x, 31 * k + comm.rank)
            copy = x.copy()
            mine = copy[comm.rank * block : (comm.rank + 1) * block] if case == "reduce_scatter-even" else copy
            want = fn(copy, comm, out=mine, **opts)
            got = planned()
            v._run(f"round {k}: the result is out", lambda: _is_same(got, out))
            _check(v, got, want, f"round {k}")


def test_plan_writes_the_given_out(comm):
    x = np.zeros((4, 3))
    out = np.full((4 * comm.size, 3), np.nan)
    with Verdict(comm) as v, hpccoll.plan(hpccoll.all_gather, x, comm, out=out) as planned:
        _rounds(comm, planned, x, lambda a: hpccoll.all_gather(a, comm), v)
        v._run("the result is out", lambda: _is_same(planned(), out))


def test_plan_of_a_non_contiguous_input_calls_the_collective(comm):
    """A strided input is packed by the collective: the plan calls it each time (no stale copy replayed)."""
    base = np.zeros((6, 8))
    x = base[:, ::2]
    with Verdict(comm) as v, hpccoll.plan(hpccoll.all_reduce, x, comm) as planned:
        if comm.size > 1:
            v._run("calls the collective", lambda: _eq(planned.methods, ("call",)))
        _rounds(comm, planned, x, lambda a: hpccoll.all_reduce(a, comm), v)


@pytest.mark.parametrize("fn", [hpccoll.all_reduce, hpccoll.all_gather], ids=["all_reduce", "all_gather"])
def test_plan_of_a_list(comm, fn):
    xs = [np.zeros(3), np.zeros((2, 2), np.int64), np.zeros(0)]
    with Verdict(comm) as v, hpccoll.plan(fn, xs, comm) as planned:
        first = None
        for k in range(3):
            for i, a in enumerate(xs):
                _fill(a, 10 * k + i + 3 * comm.rank)
            want = fn([a.copy() for a in xs], comm)
            got = planned()
            first = first or got
            for i, (g, w) in enumerate(zip(got, want)):
                _check(v, g, w, f"round {k}, array {i}")
                v._run(f"round {k}, array {i}: the same array", lambda: _is_same(g, first[i]))


@pytest.fixture(scope="module")
def line(comm):
    c = comm.cartesian((comm.size,), periodic=True)
    yield c
    c.free()


@pytest.mark.parametrize("adjoint", [False, True], ids=["forward", "adjoint"])
def test_plan_of_a_halo_exchange(line, adjoint):
    fn = hpccoll.halo_exchange_adjoint if adjoint else hpccoll.halo_exchange
    x = np.zeros((5, 3))
    with Verdict(line) as v, hpccoll.plan(fn, x, line, out=x, halo=1) as planned:
        if not adjoint and line.size > 1:
            v._run("replayed (contiguous faces, in place)", lambda: _eq(planned.methods[0] != "call", True))
        for k in range(3):
            _fill(x, 5 * k + line.rank)
            copy = x.copy()
            want = fn(copy, line, out=copy, halo=1)
            got = planned()
            v._run("in place", lambda: _is_same(got, x))
            _check(v, got, want, f"round {k}")


def test_start_and_wait(comm):
    x = np.zeros(7)
    with Verdict(comm) as v, hpccoll.plan(hpccoll.all_reduce, x, comm, op="avg") as planned:
        for k in range(3):
            _fill(x, k + comm.rank)
            want = hpccoll.all_reduce(x.copy(), comm, op="avg")
            planned.start()
            got = planned.wait()
            _check(v, got, want, f"round {k}")


def test_lifecycle(comm):
    x = np.ones(2)
    planned = hpccoll.plan(hpccoll.all_reduce, x, comm)
    planned.start()
    with pytest.raises(HpccollError, match="start"):
        planned.start()
    planned.wait()
    with pytest.raises(HpccollError, match="without start"):
        planned.wait()
    planned.free()
    planned.free()  # twice: nothing
    assert planned.freed and "freed" in repr(planned)
    for call in (planned, planned.start):
        with pytest.raises(HpccollError, match="freed"):
            call()
    with hpccoll.plan(hpccoll.broadcast, x, comm) as inside:
        inside()
    assert inside.freed
    started = hpccoll.plan(hpccoll.all_reduce, x, comm)
    started.start()
    started.free()  # completes the call first, then frees
    agree(comm, started.freed)


def test_bad_arguments_raise_on_every_rank(comm):
    x = np.ones(3)
    raises_everywhere(comm, ArgumentError, "collective: expected", lambda: hpccoll.plan(np.sum, x, comm))
    raises_everywhere(comm, ArgumentError, "collective: expected", lambda: hpccoll.plan("allreduce", x, comm))
    raises_everywhere(comm, ArgumentError, "method: expected", lambda: hpccoll.plan("all_reduce", x, comm, method="x"))
    raises_everywhere(comm, ArgumentError, "async_op", lambda: hpccoll.plan(hpccoll.all_reduce, x, comm, async_op=True))
    raises_everywhere(comm, HpccollError, "op", lambda: hpccoll.plan(hpccoll.all_reduce, x, comm, op="mean"))
    bad = x if comm.rank else "not an array"
    raises_everywhere(comm, HpccollError, None, lambda: hpccoll.plan(hpccoll.all_reduce, bad, comm), same_message=False)


def test_disagreement_raises_without_check_mode(comm):
    """Outside check mode an unplanned int64-against-float64 all-reduce gives garbage; a plan refuses it."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    assert not comm.check
    x = np.ones(4, np.int64 if comm.rank == 0 else np.float64)
    raises_everywhere(comm, MismatchError, None, lambda: hpccoll.plan(hpccoll.all_reduce, x, comm), same_message=False)
    y = np.ones(2 + comm.rank)
    raises_everywhere(comm, MismatchError, None, lambda: hpccoll.plan(hpccoll.all_reduce, y, comm), same_message=False)
    fn = hpccoll.all_reduce if comm.rank == 0 else hpccoll.broadcast
    raises_everywhere(comm, MismatchError, None, lambda: hpccoll.plan(fn, np.ones(2), comm), same_message=False)
    raises_everywhere(
        comm,
        MismatchError,
        None,
        lambda: hpccoll.plan(hpccoll.all_reduce, np.ones(2), comm, op="max" if comm.rank else "sum"),
        same_message=False,
    )


def test_all_gather_adjoint_axis_none_keeps_its_result(comm):
    """``all_gather_adjoint(ys, axis=None)`` returns one array, the same one on every call of its plan.

    Only ``all_gather(axis=None)``'s result (a new list of per-rank arrays) cannot be the next call's
    ``out``; a prefix test once caught the adjoint too, and its plan allocated a new result on every call.
    """
    p, r = comm.size, comm.rank
    ys = [np.zeros((2, q + 1)) for q in range(p)]
    with Verdict(comm) as v, hpccoll.plan(hpccoll.all_gather_adjoint, ys, comm, axis=None) as planned:
        first = None
        for k in range(3):
            for q, y in enumerate(ys):
                _fill(y, 100 * k + 10 * r + q)
            want = hpccoll.all_gather_adjoint([y.copy() for y in ys], comm, axis=None)
            got = planned()
            first = got if first is None else first
            v._run(f"round {k}: the same result object", lambda: _is_same(got, first))
            _check(v, got, want, f"round {k}")


def test_operators_plan_both_sides(comm):
    p, r = comm.size, comm.rank
    op = hpccoll.AllGather(comm, axis=0)
    x = np.zeros((r + 1, 2))
    with Verdict(comm) as v:
        forward = op.plan(x)
        _rounds(comm, forward, x, lambda a: hpccoll.all_gather(a, comm), v)
        g = np.zeros((p * (p + 1) // 2, 2))
        adjoint = op.plan_adjoint(g)  # the extents its forward learned: 1, 2, ..., P
        _rounds(comm, adjoint, g, lambda a: hpccoll.all_gather_adjoint(a, comm, sizes=list(range(1, p + 1))), v)
        v._run("adjoint's result shape", lambda: _eq(adjoint().shape, (r + 1, 2)))
        h = op.H.plan(np.zeros((p * (p + 1) // 2, 2)))
        v._run("H.plan is plan_adjoint", lambda: _eq(h.collective, "all_gather_adjoint"))
        for planned in (forward, adjoint, h):
            planned.free()


# --------------------------------------------------------------------------- the method, and the profile


def _profile(comm, methods):
    from hpccoll.transports._tuned import FORMAT, key_of

    return {"format": FORMAT, "key": key_of(comm), "methods": methods, "transports": {}}


@pytest.mark.parametrize("best", ["persistent", "blocking"])
def test_auto_follows_the_profile(comm, tmp_path, monkeypatch, best):
    if not persistent(comm):
        pytest.skip("one rank moves nothing; an MPI without persistent collectives has one method")
    path = comm.mpi.bcast(str(tmp_path / "profile.json"), root=0)
    profile = _profile(comm, {"allreduce": {"8": {"best": best}}, "bcast": {"8": {"best": best}}})  # collective
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump(profile, f)
    comm.mpi.Barrier()
    monkeypatch.setenv("HPCCOLL_TUNE_FILE", path)
    with hpccoll.Communicator() as c, Verdict(c) as v:
        for fn in (hpccoll.all_reduce, hpccoll.broadcast):
            with hpccoll.plan(fn, np.zeros(1), c) as planned:
                v._run(fn.__name__, lambda: _eq(planned.methods, (best,)))
        # 1 MiB is far from the profile's only size: measured instead (either verdict), never guessed
        with hpccoll.plan(hpccoll.all_reduce, np.zeros(1 << 17), c) as big:
            v._run("measured", lambda: _eq(big.methods[0] in ("persistent", "blocking"), True))
        from hpccoll.transports._tuned import load

        v._run("in force", lambda: _eq(load(c)["profile"] is not None, True))


def test_a_profile_of_another_layout_is_not_used(comm, tmp_path, monkeypatch):
    from hpccoll.transports._tuned import load

    path = comm.mpi.bcast(str(tmp_path / "other.json"), root=0)
    profile = _profile(comm, {})  # collective
    profile["key"]["ranks"] = comm.size + 1
    if comm.rank == 0:
        with open(path, "w") as f:
            json.dump(profile, f)
    comm.mpi.Barrier()
    monkeypatch.setenv("HPCCOLL_TUNE_FILE", path)
    with hpccoll.Communicator() as c:
        found = load(c)
        agree(c, found["profile"] is None and "ranks" in found["why"], str(found))


def test_tune_writes_a_profile_that_auto_uses(comm, tmp_path, monkeypatch):
    from hpccoll import __main__ as cli
    from hpccoll.transports._tuned import load

    path = comm.mpi.bcast(str(tmp_path / "tuned.json"), root=0)
    monkeypatch.setenv("HPCCOLL_TUNE_FILE", path)
    assert cli.main(["tune", "--rounds", "2", "--max-bytes", "1024", "--primitives", "allreduce,bcast", "-q"]) == 0
    with hpccoll.Communicator() as c, Verdict(c) as v:
        found = load(c)
        v._run("loaded", lambda: _eq(found["path"], path))
        profile = found["profile"]
        v._run("a profile", lambda: _eq(profile is not None, True))
        # a broadcast's shm-or-mpi verdict is not one a process can hand another (tune leaves it out)
        v._run("no shm verdict for bcast", lambda: _eq("bcast" in profile["transports"], False))
        if persistent(c):
            methods = profile["methods"]
            v._run("sizes", lambda: _eq(sorted(methods["allreduce"], key=int), ["8", "64", "1024"]))
            entry = methods["allreduce"]["8"]
            v._run("entry", lambda: _eq(entry["best"] in ("persistent", "blocking") and entry["blocking_us"] > 0, True))
            with hpccoll.plan(hpccoll.all_reduce, np.zeros(1), c) as planned:
                v._run("auto follows it", lambda: _eq(planned.methods, (entry["best"],)))
    assert os.path.exists(path) or comm.rank != 0


def test_info_names_the_profile(comm, tmp_path, monkeypatch, capsys):
    from hpccoll import __main__ as cli

    path = comm.mpi.bcast(str(tmp_path / "absent.json"), root=0)
    monkeypatch.setenv("HPCCOLL_TUNE_FILE", path)
    world = hpccoll._comm.as_communicator(None)  # info's communicator: what it read before is forgotten
    world.state.pop("tune profile", None)
    assert cli.main(["info"]) == 0
    world.state.pop("tune profile", None)
    out = capsys.readouterr().out
    agree(comm, comm.rank != 0 or (path in out and "no profile" in out), out[-2000:])


def test_an_mpi_without_persistent_collectives_falls_back(comm):
    """Where the MPI library lacks MPI-4's persistent collectives, method="persistent" plans blocking calls."""
    with hpccoll.Communicator(comm.mpi, transport="mpi") as c, Verdict(c) as v:
        c.transport_instance("mpi").persistent = False  # as HostMPI finds such a library (_persistent_collectives)
        x = np.zeros(5)
        with hpccoll.plan(hpccoll.all_reduce, x, c, method="persistent") as planned:
            if c.size > 1:
                v._run("blocking", lambda: _eq(planned.methods, ("blocking",)))
            _rounds(c, planned, x, lambda a: hpccoll.all_reduce(a, c), v)
