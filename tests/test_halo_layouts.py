"""Planned and unplanned halo exchanges on every face layout, against a NumPy reference of the whole grid.

1-D, 2-D and 3-D grids, periodic or not, with and without corners, ``halo`` per axis, C- and F-ordered fields,
a strided view, and C on some ranks with F on others; every dtype; empty faces. ``hpccoll.plan(halo_exchange,
x, grid, out=...)`` is one set of persistent requests on host MPI whatever the layout (``Plan.methods ==
("persistent",)`` wherever a message moves), its result on every call that of :class:`test_halo.Layout`'s
reference, and making it leaves ``x`` as it was; a transport that cannot move strided faces (the contract's
default ``sendrecv``, and NCCL, staged and cuda_mpi on the CPU stand-in) gets a plan that packs into buffers
of its own and replays the prepared call, never ``("call",)``. Check mode refuses a plan whose buffer was
reshaped or freed since, on every rank. Every verdict is collective (:func:`conftest.agree`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import standin_cupy as cp
from conftest import DTYPE_IDS, DTYPES, Verdict, agree, raises_everywhere
from test_halo import GRIDS, Layout, global_array, grid_dims, refill
from test_nccl_standin import dev, fresh, gpu, host, runtime  # noqa: F401 (fixtures)

import hpccoll
from hpccoll import HpccollError, transports
from hpccoll.transports._base import Prepared, Transport
from hpccoll.transports.host_mpi import HostMPI

pytestmark = pytest.mark.mpi

#: (grid name, periodic, halo, corners): every grid, each periodicity, per-axis halos, corners or not.
CASES = [
    ("P", False, 1, False),
    ("P", True, 2, True),
    ("Px1", True, (1, 2), True),
    ("1xP", False, 1, False),
    ("1xP", True, 2, False),
    ("1xP", (False, True), (2, 1), True),
    ("2x2", False, 1, False),
    ("2x2", True, 1, True),
    ("2x2", (True, False), (1, 2), False),
    ("auto2d", True, (0, 2), True),
    ("auto3d", False, 1, False),
    ("auto3d", True, (1, 0, 2), True),
]

#: A rank's field in each memory order, from its C-ordered block ``a`` and its rank.
ORDERS = {
    "C": lambda a, r: a,
    "F": lambda a, r: np.asfortranarray(a),
    "strided": lambda a, r: np.repeat(a, 2, axis=-1)[..., ::2],  # every axis strided, none contiguous
    "mixed": lambda a, r: np.asfortranarray(a) if r % 2 else a,  # a face contiguous at one end only
}


class Packing(HostMPI):
    """Host MPI whose ``sendrecv`` is the contract's default (one all-to-all of packed bytes), as NCCL's and
    staged's are: it moves only contiguous buffers."""

    name = "test_packing"
    priority = 10_000  # never auto's choice
    strided_messages = False
    sendrecv = Transport.sendrecv
    isendrecv = Transport.isendrecv
    _sendrecv = Transport._sendrecv

    def prepare(self, primitive, args, method="blocking"):
        if primitive == "sendrecv":
            return Prepared(self, primitive, args)
        return super().prepare(primitive, args, method)


@pytest.fixture(scope="module")
def packing():
    transports.register(Packing)
    yield Packing.name
    transports.unregister(Packing.name)


@contextlib.contextmanager
def cartesian(comm, transport, dims, periodic):
    """A Cartesian communicator on ``comm`` (``transport`` None) or on a new one with that transport (freed)."""
    base = comm if transport is None else hpccoll.Communicator(comm.mpi, transport=transport)
    try:
        with base.cartesian(dims, periodic=periodic) as cart:
            yield cart
    finally:
        if base is not comm:
            base.free()


def moves(cart):
    """Whether any rank of ``cart`` exchanges anything (several ranks, or a periodic axis)."""
    return cart.size > 1 or any(cart.periodic)


def planned_steps(v, cart, lay, halo, corners, order, what, fn=hpccoll.halo_exchange, out_of_place=False):
    """Three calls of a plan, each against the reference: the first on the field as it was when the plan was
    made (which making the plan leaves as it was), the others on the field refilled in place."""
    me = cart.rank
    trailing = (2,)
    G = global_array(lay, np.float64, 300, trailing)
    x = ORDERS[order](lay.make_x(me, G, 301, trailing), me)
    before = x.copy()
    out = np.zeros_like(x) if out_of_place else x
    with hpccoll.plan(fn, x, cart, out=out, halo=halo, corners=corners) as p:
        v.same(x, before, f"{what}: x modified by making the plan")
        for step in range(3):
            seed = 300 + 2 * step
            if step:
                refill(lay, me, x, G, seed)
                before = x.copy()
            if fn is hpccoll.halo_exchange:
                want = lay.forward(me, x, G, corners)
            else:  # every rank's cotangent is its field: make_x of the same seed on each rank
                gs = [lay.make_x(q, G, seed + 1, trailing) for q in range(cart.size)]
                want = lay.adjoint(me, gs, corners)
            got = p()
            v.true(got is out, f"{what}: the plan's result is not out")
            if fn is hpccoll.halo_exchange:
                v.same(got, want, f"{what} step {step}")
            else:  # sums: in another order than the reference's where several ghosts land on one cell
                v.close(got, want, f"{what} step {step}")
            if out_of_place:
                v.same(x, before, f"{what} step {step}: x modified")
        return p.methods


@pytest.mark.parametrize("grid, periodic, halo, corners", CASES)
@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("transport", ["mpi", "shm", Packing.name])
def test_plan_every_layout(comm, packing, grid, periodic, halo, corners, order, transport):
    """A plan of the forward, in place and into another out, on every layout: persistent on host MPI (and on
    shm, which leaves private fields to it); on a transport that moves only contiguous buffers, packed into
    the plan's own buffers and its prepared call replayed (``"blocking"``: the contract's default), never
    ``"call"``."""
    dims = grid_dims(comm, grid)
    with cartesian(comm, transport, dims, periodic) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, periodic, halo)
        what = f"{transport} {grid} {cart.dims} periodic {periodic} halo {halo} corners {corners} {order}"
        for out_of_place in (False, True):
            methods = planned_steps(v, cart, lay, halo, corners, order, what, out_of_place=out_of_place)
            want = ("blocking",) if transport == Packing.name else ("persistent",)
            if moves(cart) and any(lay.halo):
                v.true(methods == want, f"{what} out_of_place={out_of_place}: methods {methods}")


@pytest.mark.parametrize("grid, periodic, halo, corners", CASES[::2])
def test_plan_of_the_adjoint(comm, grid, periodic, halo, corners):
    """The adjoint's plan (sent ghosts copied then zeroed, what arrives added): replayed, the full road's."""
    dims = grid_dims(comm, grid)
    with comm.cartesian(dims, periodic=periodic) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, periodic, halo)
        what = f"adjoint {grid} {cart.dims} periodic {periodic} halo {halo} corners {corners}"
        methods = planned_steps(v, cart, lay, halo, corners, "C", what, fn=hpccoll.halo_exchange_adjoint)
        if moves(cart) and any(lay.halo):
            v.true("call" not in methods, f"{what}: methods {methods}")


@pytest.mark.parametrize("grid", [g for g in GRIDS if g != "Px1"])
@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("transport", [None, Packing.name])
def test_unplanned_every_layout(comm, packing, grid, order, transport):
    """The unplanned exchange (strided faces moved where they lie, or packed), repeated in place, started,
    and into another out, and the adjoint, against the reference."""
    dims = grid_dims(comm, grid)
    for periodic in (False, True):
        with cartesian(comm, transport, dims, periodic) as cart, Verdict(cart) as v:
            for halo, corners in [(1, True), (2, False)]:
                unplanned_steps(v, cart, Layout(cart.dims, periodic, halo), halo, corners, order)


def unplanned_steps(v, cart, lay, halo, corners, order):
    """Three in-place calls (the last started), one into an F-ordered out, the adjoint into a new array and
    in place, each against the reference."""
    me = cart.rank
    G = global_array(lay, np.float32, 330, (3,))
    x = ORDERS[order](lay.make_x(me, G, 331, (3,)), me)
    what = f"{cart.dims} periodic {lay.periodic} halo {halo} corners {corners} {order}"
    for step in range(3):
        refill(lay, me, x, G, 332 + 2 * step)
        want = lay.forward(me, x, G, corners)
        got = hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=x, async_op=step == 2)
        v.same(got.wait() if step == 2 else got, want, f"{what} step {step}")
    out = np.zeros(x.shape[::-1], x.dtype).T
    v.same(hpccoll.halo_exchange(x, cart, halo=halo, corners=corners, out=out), want, f"{what} out")
    # the adjoint, a different cotangent on every rank: into a new array, then in place
    gs = [ORDERS[order](lay.make_x(q, G, 340, (3,)), q) for q in range(cart.size)]
    want = lay.adjoint(me, gs, corners)
    v.close(hpccoll.halo_exchange_adjoint(gs[me], cart, halo=halo, corners=corners), want, f"{what} adjoint")
    g = gs[me]
    v.close(hpccoll.halo_exchange_adjoint(g, cart, halo=halo, corners=corners, out=g), want, f"{what} adj in place")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_faces_every_dtype(comm, dtype):
    """Strided faces of every dtype (those without a predefined MPI datatype move as bytes), in C and F
    order, unplanned and planned, against the reference: exact."""
    dims = grid_dims(comm, "auto2d")
    me = comm.rank
    with comm.cartesian(dims, periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, (1, 2))
        for order in ("F", "mixed"):
            G = global_array(lay, dtype, 350, (2,))
            x = ORDERS[order](lay.make_x(me, G, 351, (2,)), me)
            want = lay.forward(me, x, G, True)
            v.same(hpccoll.halo_exchange(x, cart, halo=(1, 2), corners=True), want, f"{dtype} {order}")
            with hpccoll.plan(hpccoll.halo_exchange, x, cart, out=x, halo=(1, 2), corners=True) as p:
                v.same(p(), want, f"{dtype} {order} planned")


@pytest.mark.timeout(60)
def test_check_mode_refuses_a_changed_buffer(comm):
    """In check mode a plan called after its buffer was reshaped (on one rank) raises on every rank, and so
    does one freed on one rank; restored, the plan runs again."""
    me = comm.rank
    with hpccoll.Communicator(comm.mpi, check=True).cartesian([comm.size], periodic=True) as cart:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 340, (4,))
        x = lay.make_x(me, G, 341, (4,))
        p = hpccoll.plan(hpccoll.halo_exchange, x, cart, out=x, halo=1)
        agree(cart, p.methods == ("persistent",), f"methods {p.methods}")
        shape = x.shape
        if me == cart.size - 1:
            x.shape = (shape[0] * 2, 2)  # the same memory, another shape
        raises_everywhere(cart, HpccollError, "changed since the plan was made", p, same_message=False)
        x.shape = shape
        refill(lay, me, x, G, 342)
        want = lay.forward(me, x, G, False)
        agree(cart, lambda: np.testing.assert_array_equal(p(), want))
        if me == 0:
            p.free()
        raises_everywhere(cart, HpccollError, "freed", p, same_message=False)
        p.free()


@pytest.mark.parametrize("transport", ["nccl", "staged", "cuda_mpi"])
def test_device_transports_standin(fresh, runtime, transport):  # noqa: F811 (the fixtures imported above)
    """The transports that move only contiguous device buffers (the CPU stand-in): strided faces packed,
    unplanned and planned (into the plan's own buffers: its prepared call, never ``"call"``), forward and
    adjoint, against the reference."""
    base = fresh(transport=transport)
    me = base.rank
    cp.cuda.Device(me % runtime.devices).use()  # as a job selects its GPU before allocating
    with base.cartesian(grid_dims(base, "auto2d"), periodic=(True, False)) as cart, Verdict(cart) as v:
        for halo, corners in [(1, True), ((2, 1), False)]:
            lay = Layout(cart.dims, (True, False), halo)
            what = f"{transport} halo {halo} corners {corners}"
            G = global_array(lay, np.float64, 360, (2,))
            x = lay.make_x(me, G, 361, (2,))
            want = lay.forward(me, x, G, corners)
            v.same(host(hpccoll.halo_exchange(dev(x), cart, halo=halo, corners=corners)), want, what)
            strided = dev(np.ascontiguousarray(x.T)).T  # every face across grid axis 1 strided
            got = hpccoll.halo_exchange(strided, cart, halo=halo, corners=corners, async_op=True).wait()
            v.same(host(got), want, f"{what} strided")
            gs = [lay.make_x(q, G, 362, (2,)) for q in range(cart.size)]
            got = hpccoll.halo_exchange_adjoint(dev(gs[me]), cart, halo=halo, corners=corners)
            v.close(host(got), lay.adjoint(me, gs, corners), f"{what} adjoint")
            for fn in (hpccoll.halo_exchange, hpccoll.halo_exchange_adjoint):
                field = dev(x)
                with hpccoll.plan(fn, field, cart, out=field, halo=halo, corners=corners) as p:
                    for step in range(2):
                        refill(lay, me, x, G, 363 + 2 * step)
                        gs = [lay.make_x(q, G, 364 + 2 * step, (2,)) for q in range(cart.size)]
                        field[...] = dev(x if fn is hpccoll.halo_exchange else gs[me])
                        got = host(p())
                        if fn is hpccoll.halo_exchange:
                            v.same(got, lay.forward(me, x, G, corners), f"{what} planned step {step}")
                        else:
                            v.close(got, lay.adjoint(me, gs, corners), f"{what} planned adjoint step {step}")
                    v.true("call" not in p.methods, f"{what} {fn.__name__}: methods {p.methods}")


@pytest.mark.parametrize("order", ["C", "F"])
def test_empty_faces(comm, order):
    """Fields with a trailing extent of 0 (every message empty): unplanned, planned (persistent on host MPI,
    as any other layout) and the adjoint, against the reference."""
    dims = grid_dims(comm, "auto2d")
    with cartesian(comm, "mpi", dims, True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, 1)
        G = global_array(lay, np.float64, 370, (0,))
        x = ORDERS[order](lay.make_x(cart.rank, G, 371, (0,)), cart.rank)
        v.same(hpccoll.halo_exchange(x, cart, halo=1, corners=True), x, "forward")
        v.same(hpccoll.halo_exchange_adjoint(x, cart, halo=1), x, "adjoint")
        with hpccoll.plan(hpccoll.halo_exchange, x, cart, out=x, halo=1) as p:
            v.same(p(), x, "planned")
            v.true(p.methods == ("persistent",), f"methods {p.methods}")


@pytest.mark.parametrize("order", ["C", "mixed"])
def test_faces_past_the_strided_limit(comm, order):
    """Strided faces of 8 KiB and more (host MPI packs them where its MPI moves them slowly as derived
    datatypes: MPICH), beside small ones, unplanned and planned, against the reference."""
    dims = grid_dims(comm, "1xP")
    with comm.cartesian(dims, periodic=True) as cart, Verdict(cart) as v:
        lay = Layout(cart.dims, True, (1, 2), extent=lambda axis, coord: 1030 if axis == 0 else 3 + coord % 2)
        G = global_array(lay, np.float64, 380)
        x = ORDERS[order](lay.make_x(cart.rank, G, 381), cart.rank)
        want = lay.forward(cart.rank, x, G, True)
        v.same(hpccoll.halo_exchange(x, cart, halo=(1, 2), corners=True), want, "unplanned")
        for step in range(3):  # repeated in place: kept from the second call on
            refill(lay, cart.rank, x, G, 382 + 2 * step)
            want = lay.forward(cart.rank, x, G, True)
            v.same(hpccoll.halo_exchange(x, cart, halo=(1, 2), corners=True, out=x), want, f"in place, step {step}")
        with hpccoll.plan(hpccoll.halo_exchange, x, cart, out=x, halo=(1, 2), corners=True) as p:
            v.same(p(), want, "planned")
            v.true(p.methods == ("persistent",), f"methods {p.methods}")
