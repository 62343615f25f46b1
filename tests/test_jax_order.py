"""The order jitted JAX collectives run in: the jaxpr's order, on every rank alike, one at a time.

A collective that two ranks run in different orders, or two collectives that one rank runs at once
from two threads, mismatch or deadlock. ``jax.experimental.buffer_callback`` alone gives no order:
its effect is unordered, so XLA's CPU runtime runs independent callbacks concurrently and in an
order of its own. The adapter's buffer lowering threads the ordered effect's token through each
call (``hcj._buffer_lowering``); these tests prove that it holds, for every lowering this JAX has.

Each test records, in the callbacks themselves, the input and result shape of every collective as
it starts, and how many ran at once; it compares that log with the order the jaxpr states
(:func:`program_order`: the collectives and the ordered ``io_callback`` marks in equation order,
a scan's body ``length`` times, a cond's taken branch), on every rank, and the logs across ranks.
The buffer lowering is first checked with callbacks that record and do not communicate (a probe:
run out of order, real collectives would mismatch or hang), then, as every lowering, with the real
collectives, whose results must equal the same functions run eagerly (hpccoll on NumPy views; the
values themselves are checked against NumPy in ``tests/test_jax_adapter.py``). The shapes are
distinct per collective and large enough (tens of KiB) for XLA's CPU runtime to run independent
operations concurrently. With the token removed from ``_buffer_lowering``, the probes fail: the
log comes out of order and callbacks overlap.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from conftest import agree  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.extend.core import ClosedJaxpr, Jaxpr  # noqa: E402

from hpccoll.adapters import jax as hcj  # noqa: E402

pytestmark = pytest.mark.mpi

#: Elements per rank of the smallest collective: 2,000 float32 (8 KB) and up, so that XLA's CPU runtime
#: may run independent callbacks concurrently (it runs programs of small buffers sequentially anyway).
BASE = 2000


@pytest.fixture(params=hcj.LOWERINGS)
def lowering(request, monkeypatch):
    monkeypatch.setattr(hcj, "LOWERING", request.param)
    return request.param


class Recorder:
    """Wraps the map a lowering runs: logs (input shape, result shape) as it starts, and the most running at once."""

    def __init__(self, communicate: bool) -> None:
        self.communicate = communicate
        self.log: list = []
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def wrap(self, fn):
        def recorded(a, out=None):
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
                entry = [tuple(a.shape), None if out is None else tuple(out.shape)]
                self.log.append(entry)
            try:
                time.sleep(0.0005)  # widen the window in which an unordered neighbour would start
                if self.communicate:
                    got = fn(a, out=out)
                else:  # the probe: zeros, a value every branch and loop of the tests' functions accepts
                    got = out
                    got[...] = 0
                entry[1] = tuple(got.shape)
                return got
            finally:
                with self.lock:
                    self.running -= 1

        return recorded

    def mark(self) -> np.int32:
        """The body of an ordered ``io_callback``: its place in the log."""
        with self.lock:
            self.log.append("mark")
        return np.int32(0)

    def entries(self) -> list:
        return [e if e == "mark" else tuple(e) for e in self.log]


#: The recorder in use: where an ordered io_callback's mark goes.
CURRENT: list = []


def recording(monkeypatch, lowering: str, communicate: bool) -> Recorder:
    """Record every collective the lowering runs from now on (the buffer lowering only, without communicating)."""
    rec = Recorder(communicate)
    CURRENT[:] = [rec]
    if lowering == "buffer":
        for platform in ("cpu",):
            original = hcj._BUFFER_CALLS[platform]
            monkeypatch.setitem(hcj._BUFFER_CALLS, platform, lambda fn, original=original: original(rec.wrap(fn)))
    else:
        assert communicate, "a host callback must return its result: only the buffer lowering can skip the collective"
        original_host = hcj._host_callback
        monkeypatch.setattr(hcj, "_host_callback", lambda fn: original_host(rec.wrap(fn)))
    return rec


def program_order(closed, branch: int) -> list:
    """The callbacks ``closed`` runs, in its order: (name, input shape, result shape) per collective, "mark" per
    ordered io_callback.

    Collectives with no callback (the identity) are left out; a scan's body counts ``length``
    times; a cond counts its branch ``branch``; other nested jaxprs (jit, custom_jvp/vjp) in place.
    """
    order: list = []
    for eqn in closed.jaxpr.eqns:
        name = eqn.primitive.name
        if name == "hpccoll":
            fwd = eqn.params["fwd"]
            if fwd.call is not None:
                order.append((fwd.name, tuple(eqn.invars[0].aval.shape), tuple(eqn.params["shape"])))
        elif name == "io_callback":
            order.append("mark")
        elif name == "scan":
            order += program_order(eqn.params["jaxpr"], branch) * eqn.params["length"]
        elif name == "cond":
            order += program_order(eqn.params["branches"][branch], branch)
        else:
            for p in eqn.params.values():
                if isinstance(p, ClosedJaxpr):
                    order += program_order(p, branch)
                elif isinstance(p, Jaxpr):
                    order += program_order(ClosedJaxpr(p, ()), branch)
    return order


def check_order(comm, monkeypatch, lowering, f, args, branch=1):
    """``jax.jit(f)(*args)`` runs its collectives in ``f``'s jaxpr order on every rank, one at a time, with the values
    of ``f`` run eagerly; for the buffer lowering, first as a probe that does not communicate."""
    program = program_order(jax.make_jaxpr(f)(*args), branch)
    want = [e if e == "mark" else e[1:] for e in program]  # what a callback sees: its input and result shapes
    names = comm.mpi.allgather([e if e == "mark" else e[0] for e in program])
    agree(comm, all(n == names[0] for n in names), f"the ranks' programs differ: {names}")
    agree(comm, len(want) >= 4, f"expected a program with several collectives; got {want}")
    runs = [False, True] if lowering == "buffer" else [True]
    for communicate in runs:
        with monkeypatch.context() as m:
            rec = recording(m, lowering, communicate)
            got = jax.block_until_ready(jax.jit(lambda *a: f(*a))(*args))  # a new function: lowered with this recorder
            jax.effects_barrier()
        log = rec.entries()
        what = "probe" if not communicate else "collectives"
        agree(comm, log == want, lambda: f"{lowering} {what}: ran in the order\n{log}\nexpected the jaxpr's\n{want}")
        agree(comm, rec.most == 1, f"{lowering} {what}: {rec.most} callbacks ran at once")
    eager = f(*args)  # XLA may fuse the arithmetic around the collectives differently: float32 rounding apart

    def same(a, b):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-5)

    agree(comm, lambda: jax.tree_util.tree_map(same, got, eager))


def shards(comm, count, seed):
    """``count`` arrays, the i-th of ``comm.size * (BASE + 8 i)`` float32 values (rows divisible by P), rank-varying."""
    rng = np.random.default_rng(seed + 101 * comm.rank)
    return [jnp.asarray(rng.standard_normal(comm.size * (BASE + 8 * i)).astype(np.float32)) for i in range(count)]


def collectives(comm, linear=False):
    """Ten collectives of every kind (nine linear ones), each a function of a 1-D array of a multiple of P values."""
    last = comm.size - 1
    every = [
        lambda v: hcj.all_reduce(v, comm),
        lambda v: hcj.all_gather(v, comm),
        lambda v: hcj.reduce_scatter(v, comm),
        lambda v: hcj.all_to_all(v, comm),
        lambda v: hcj.broadcast(v, comm, root=last),
        lambda v: hcj.reduce(v, comm, root=last),
        lambda v: hcj.gather(v, comm, root=0),
        lambda v: hcj.scatter(v, comm, root=last),
        lambda v: hcj.all_reduce(v, comm, op="max"),
        lambda v: hcj.all_gather(v, comm, sizes=[v.shape[0]] * comm.size),
    ]
    return every[:8] + every[9:] if linear else every


def test_independent_collectives_and_io_callbacks_run_in_program_order(comm, monkeypatch, lowering):
    """Twelve collectives that share no data, with ordered io_callbacks between them."""
    calls = collectives(comm) + collectives(comm)[:2]
    xs = shards(comm, len(calls), seed=1)
    check_order(comm, monkeypatch, lowering, lambda xs: marked(calls, xs), (xs,))


def test_collectives_and_their_adjoints_in_grad_run_in_program_order(comm, monkeypatch, lowering):
    """value_and_grad: the forward collectives in order, then the adjoints in the order the transposition wrote them."""
    calls = collectives(comm, linear=True)
    xs = shards(comm, len(calls), seed=2)
    ws = [
        jnp.asarray(np.random.default_rng(3 + i + 7 * comm.rank).standard_normal(c(x).shape).astype(np.float32))
        for i, (c, x) in enumerate(zip(calls, xs))
    ]

    def loss(xs):
        return sum(jnp.vdot(w, c(x)) for c, x, w in zip(calls, xs, ws))

    check_order(comm, monkeypatch, lowering, jax.value_and_grad(loss), (xs,))


def marked(calls, xs, after=(3, 7)):
    """Each call on its array, an ordered io_callback (a mark in the log) after the calls numbered ``after``."""
    out = []
    for i, (call, x) in enumerate(zip(calls, xs)):
        out.append(call(x))
        if i in after:
            out.append(io_callback(lambda: CURRENT[0].mark(), jax.ShapeDtypeStruct((), np.int32), ordered=True))
    return out


def test_collectives_under_scan_and_cond_run_in_program_order(comm, monkeypatch, lowering):
    """Six independent collectives and two marks in a scan's body, three steps; then a cond whose branches
    hold different collectives."""
    P = comm.size
    calls = collectives(comm)[:6]
    xs = shards(comm, len(calls), seed=4)

    def f(xs):
        def body(c, _):
            ys = [y for y in marked(calls, c, after=(1, 3)) if y.ndim]  # the collectives' results, not the marks
            return [v + 0.5 * jnp.mean(y) for v, y in zip(c, ys)], jnp.sum(ys[0])

        c, sums = jax.lax.scan(body, xs, None, length=3)
        pick = jnp.sum(c[0]) > -1e30  # true on every rank
        taken = jax.lax.cond(
            pick,
            lambda v: hcj.all_gather(hcj.all_to_all(v, comm), comm)[: v.shape[0]],
            lambda v: hcj.broadcast(v, comm) * P,
            c[1],
        )
        return taken, sums

    check_order(comm, monkeypatch, lowering, f, (xs,), branch=1)


def test_collectives_under_vmap_run_in_program_order(comm, monkeypatch, lowering):
    """vmap batches each collective into one on the stacked array: the same order, batched shapes."""
    calls = collectives(comm)
    xs = [jnp.stack([x, 2 * x, -x]) for x in shards(comm, len(calls), seed=5)]
    check_order(comm, monkeypatch, lowering, jax.vmap(lambda *xs: marked(calls, xs)), tuple(xs))
