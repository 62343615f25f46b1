"""The control plane's exchanges and agreements, call by call, against a recorded file (tests/control_plane.json).

For every public collective and adjoint, and the plan of each, on each path (``common``: contiguous NumPy
along axis 0; ``general``: a strided view along another axis; ``check``: check mode; ``list``: a list of
arrays; ``async``: ``async_op=True``; ``plan`` and ``plan-check``: made, then called twice), this test records
every control-plane call the collective makes, in order: the size, shape and layout exchanges (their MPI call
and how many int64 each rank sends to each rank: the values and the signature hash), and the pickled
agreements (check mode's descriptors, by their keys, and the plans'). It compares them with the file, per
rank count (1 to 4), and fails on any drift, naming the path and the collective.

The data plane (the messages that move the arrays) is not recorded: its calls are named ``MPI_<call>`` and
the transports own them.

The control plane is recorded where it goes through :mod:`hpccoll.transports._control` (``guarded``, which
``run``, ``allgather_object`` and the exchanges call). When the library moves a control-plane exchange
elsewhere, this hook follows it, and the recording stays the same.

To regenerate the file after an intended change, at each rank count::

    for n in 1 2 3 4; do
        HPCCOLL_RECORD_CONTROL_PLANE=1 .venv/bin/mpiexec -n $n .venv/bin/python -m mpi4py -m pytest -q \\
            -p no:cacheprovider --with-mpi tests/test_control_plane.py
    done

and review the diff of tests/control_plane.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import agree

import hpccoll
from hpccoll.collectives import halo
from hpccoll.transports import _control

pytestmark = pytest.mark.mpi

RECORDED = Path(__file__).with_name("control_plane.json")
RECORD = os.environ.get("HPCCOLL_RECORD_CONTROL_PLANE") == "1"
RANKS = (1, 2, 3, 4)

#: The control-plane labels' endings: what kind of exchange or agreement each call is.
_KINDS = (
    ("'s size exchange", "size exchange"),
    ("'s shape exchange", "shape exchange"),
    ("'s layout agreement", "layout agreement"),
    ("'s cross-rank check", "agreement"),
)
_DATA = re.compile(r"MPI_\w+")


def _describe(comm, what, call, args):
    """One control-plane call as a line: its kind, MPI call, payload and label."""
    name = getattr(call, "__name__", repr(call))
    kind, label = "other", what
    for ending, k in _KINDS:
        if what.endswith(ending):
            kind, label = k, what[: -len(ending)]
            break
    if name in ("Allgather", "Alltoall"):
        ints = len(args[0]) // (comm.size if name == "Alltoall" else 1)
        return f"{kind}: {name} of {ints} int64 | {label}"
    obj = args[0] if args else None
    if isinstance(obj, tuple) and len(obj) == 4 and isinstance(obj[3], str):  # Communicator.agree's
        return f"{kind}: {name} | {label} | {_keys(obj[0])}"
    return f"{kind}: {name} of {type(obj).__name__} | {label}"


def _keys(desc):
    """A descriptor by its keys (the values differ by rank count), with its ``collective`` named."""
    if not isinstance(desc, dict):
        return repr(desc) if desc is None else type(desc).__name__
    keys = []
    for k, v in desc.items():
        if k == "collective":
            keys.append(f"collective={v}")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            keys.append(f"{k}[{','.join(v[0])}]")
        else:
            keys.append(k)
    return ", ".join(keys)


@contextlib.contextmanager
def recording(log):
    """Append each control-plane call to ``log`` while inside.

    Every exchange and agreement goes through ``_control.guarded``, but one: the halo exchange's kept calls
    agree through a prepared ``Allreduce`` of their own (``halo._Gate``), whose first step is recorded here.
    """
    real, two_steps = _control.guarded, halo._two_steps

    def spy(comm, what, call, *args):
        if not _DATA.fullmatch(what):
            log.append(_describe(comm, what, call, args))
        return real(comm, what, call, *args)

    def gate_steps(prepared):
        first, then = two_steps(prepared)

        def recorded_first():
            log.append("kept halo agreement: allreduce (max), prepared")
            return first()

        return recorded_first, then

    _control.guarded, halo._two_steps = spy, gate_steps
    try:
        yield log
    finally:
        _control.guarded, halo._two_steps = real, two_steps


# --------------------------------------------------------------------------- the calls


def _sizes(p):
    return [(3 * r + 2) % 4 for r in range(p)]  # uneven, a rank with 0 from P=3


def _arr(shape, dtype=np.float64, seed=0):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) + seed


#: name -> (options(P), this rank's input shape(P, r) along axis 0, the keyword of the axis it splits or joins
#: along, and the ``sizes`` keywords that spare the size exchange (P)). ``general`` moves axis 0's extent to
#: axis 1 where the collective takes an axis, and passes a strided view (every other column) in every case.
CASES = {
    "all_gather": (lambda p: {}, lambda p, r: (r + 1, 3), "axis", lambda p: {"sizes": list(range(1, p + 1))}),
    "all_gather_adjoint": (
        lambda p: {},
        lambda p, r: (p * (p + 1) // 2, 2),
        "axis",
        lambda p: {"sizes": list(range(1, p + 1))},
    ),
    "reduce_scatter": (lambda p: {}, lambda p, r: (2 * p, 3), "axis", lambda p: {"sizes": [2] * p}),
    "reduce_scatter_adjoint": (
        lambda p: {},
        lambda p, r: (r + 1, 3),
        "axis",
        lambda p: {"sizes": list(range(1, p + 1))},
    ),
    "all_reduce": (lambda p: {}, lambda p, r: (5, 2), None, None),
    "all_reduce_adjoint": (lambda p: {}, lambda p, r: (5, 2), None, None),
    "all_to_all": (
        lambda p: {},
        lambda p, r: (2 * p, 3),
        "split_axis",
        lambda p: {"sizes": [2] * p, "recv_sizes": [2] * p},
    ),
    "all_to_all_adjoint": (
        lambda p: {},
        lambda p, r: (2 * p, 3),
        "split_axis",
        lambda p: {"sizes": [2] * p, "recv_sizes": [2] * p},
    ),
    "broadcast": (lambda p: {"root": p - 1}, lambda p, r: (4, 2), None, None),
    "broadcast_adjoint": (lambda p: {"root": p - 1}, lambda p, r: (4, 2), None, None),
    "reduce": (lambda p: {"root": p // 2}, lambda p, r: (5, 2), None, None),
    "reduce_adjoint": (lambda p: {"root": p // 2}, lambda p, r: (5, 2), None, None),
    "gather": (lambda p: {"root": 0}, lambda p, r: (r + 1, 2), "axis", lambda p: {"sizes": list(range(1, p + 1))}),
    "gather_adjoint": (
        lambda p: {"root": 0, "sizes": list(range(1, p + 1))},
        lambda p, r: (p * (p + 1) // 2 if r == 0 else 0, 2),
        "axis",
        None,
    ),
    "scatter": (
        lambda p: {"root": p - 1},
        lambda p, r: (3 * p + 1 if r == p - 1 else 0, 2),
        "axis",
        lambda p: {"sizes": [3] * (p - 1) + [4]},
    ),
    "scatter_adjoint": (
        lambda p: {"root": p - 1},
        lambda p, r: (r + 1 if r < p - 1 else r + 2, 2),
        "axis",
        lambda p: {"sizes": [r + 1 for r in range(p - 1)] + [p + 1]},
    ),
    "halo_exchange": (lambda p: {"halo": 1}, lambda p, r: (5, 4), None, None),
    "halo_exchange_adjoint": (lambda p: {"halo": 1}, lambda p, r: (5, 4), None, None),
    "shift": (lambda p: {"offset": 1}, lambda p, r: (3, 2), None, None),
    "shift_adjoint": (lambda p: {"offset": 1}, lambda p, r: (3, 2), None, None),
    "permute": (lambda p: {"perm": [(i, i + 1) for i in range(p - 1)]}, lambda p, r: (3, 2), None, None),
    "permute_adjoint": (lambda p: {"perm": [(i, i + 1) for i in range(p - 1)]}, lambda p, r: (3, 2), None, None),
}
#: The paths: what each changes from ``common`` (``check-``: the same in check mode).
PATHS = (
    "common",
    "general",
    "sized",
    "list",
    "async",
    "repeat",
    "check",
    "check-general",
    "check-list",
    "check-async",
    "plan",
    "plan-check",
)


def _input(name, p, r, general, seed=0):
    """This rank's input and options for ``name``: contiguous along axis 0, or (``general``) a strided view."""
    options, shape, axis, _ = CASES[name]
    opts, shape = options(p), shape(p, r)
    if not general:
        return _arr(shape, seed=seed), opts
    if axis is not None:  # the axis' extent moves to axis 1
        shape = (shape[1], shape[0])
        opts = {**opts, axis: 1}
        if axis == "split_axis":
            opts["concat_axis"] = 1
    wide = _arr((shape[0], 2 * shape[1]), seed=seed)
    return wide[:, ::2], opts


def _comm_for(name, comm, check):
    """A fresh Communicator (nothing cached from other calls), Cartesian for the halo exchange."""
    fresh = hpccoll.Communicator(comm.mpi, check=check)
    if not name.startswith("halo_exchange"):
        return fresh, fresh
    cart = fresh.cartesian([fresh.size])
    return fresh, cart


def _run(name, path, comm):
    """The control-plane calls of ``name`` on ``path``, in order, on this rank (``None``: no such path)."""
    p, r = comm.size, comm.rank
    fn = getattr(hpccoll, name)
    check = path.startswith("check") or path == "plan-check"
    way = path[len("check-") :] if path.startswith("check-") else path
    x, opts = _input(name, p, r, way == "general")
    if way == "sized":
        sized = CASES[name][3]
        if sized is None:
            return None
        opts.update(sized(p))
    fresh, c = _comm_for(name, comm, check)
    log = []
    try:
        with recording(log):
            if way == "list":
                if "sizes" in opts:  # one entry per array
                    opts["sizes"] = [opts["sizes"]] * 2
                fn([x, _input(name, p, r, False, seed=1)[0].astype(np.float32)], c, **opts)
            elif way == "async":
                fn(x, c, async_op=True, **opts).wait()
            elif way == "repeat":  # into the first call's result: the halo exchange keeps such a call
                y = fn(x, c, **opts)
                for _ in range(3):
                    fn(x, c, out=y, **opts)
            elif way.startswith("plan"):
                # "blocking": "auto" would add the transport's choice of method, which depends on the MPI library
                planned = hpccoll.plan(fn, x, c, method="blocking", **opts)
                planned()
                planned()
                planned.free()
            else:
                fn(x, c, **opts)
    finally:
        if c is not fresh:
            c.free()
        fresh.free()
    return log


def _recorded():
    with open(RECORDED) as f:
        return json.load(f)


def _gathered(comm, mine):
    """Every rank's record: one list when the ranks' are the same (they should be), else one per rank."""
    every = comm.mpi.allgather(mine)
    return every[0] if all(e == every[0] for e in every) else {f"rank {q}": e for q, e in enumerate(every)}


@pytest.mark.parametrize("path", PATHS)
def test_control_plane_unchanged(comm, path):
    if comm.size not in RANKS:
        pytest.skip(f"recorded at {RANKS} ranks")
    got = {}
    for name in CASES:
        mine = _run(name, path, comm)
        if mine is not None:
            got[name] = _gathered(comm, mine)
    if RECORD:
        if comm.rank == 0:
            table = _recorded() if RECORDED.exists() else {}
            table.setdefault(str(comm.size), {})[path] = got
            with open(RECORDED, "w") as f:
                json.dump(table, f, indent=1, sort_keys=True)
                f.write("\n")
        comm.mpi.Barrier()
        return
    want = _recorded().get(str(comm.size), {}).get(path)

    def same():
        assert want is not None, f"nothing recorded for {comm.size} ranks, path {path!r}"
        drift = [
            f"{path} / {name}:\n  recorded: {want.get(name)}\n  now:      {got.get(name)}"
            for name in sorted(set(want) | set(got))
            if want.get(name) != got.get(name)
        ]
        assert not drift, "control plane drifted (regenerate tests/control_plane.json if intended):\n" + "\n".join(
            drift
        )

    agree(comm, same)


def test_every_public_collective_is_recorded():
    """The table covers every public collective and adjoint (a new one must be added here)."""
    from hpccoll._api import PAIRS

    public = {fn.__name__ for pair in PAIRS for fn in (pair.forward, pair.adjoint)}
    assert public == set(CASES)
