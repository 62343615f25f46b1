"""What a registered pair gets without any file of its own but its spec: the operator, explain and the bench row.

A throwaway point-to-point pair, ``chain_shift`` (rank ``r`` gets rank ``r - step``'s block, the ranks below
``step`` get zeros; adjoint: rank ``r`` gets rank ``r + step``'s, the last ``step`` ranks zeros), is registered
for each test (:func:`chain`: its public functions forward to :func:`hpccoll.shift`, its hooks are built like
shift's) and taken out again afterwards. Every check compares against NumPy on a global array with a leading
rank axis, at any rank count, and agrees its verdict across ranks first.
"""

import functools
import inspect

import numpy as np
import pytest
from conftest import agree, assert_same, make, raises_everywhere

import hpccoll
from hpccoll import _api, _bench, _operators, _spec
from hpccoll._comm import as_communicator
from hpccoll._errors import ArgumentError

pytestmark = pytest.mark.mpi

SHAPE = (3, 4)


def _step_of(step):
    if type(step) is not int or step < 1:
        raise ArgumentError(f"step: expected an int >= 1; got {step!r}")
    return step


def _configure(comm, keywords):
    return {**keywords, "step": _step_of(keywords.get("step", 1))}


def _peers(rank, size, keywords):
    step = keywords["step"]
    return (rank + step if rank + step < size else None), (rank - step if rank >= step else None)


def _zeroed(result, zero):
    """``result`` (or a request of it) with this rank's arrays zeroed where ``zero``."""

    def finish(y):
        if zero:
            for a in y if isinstance(y, list) else [y]:
                a[...] = 0
        return y

    return result.then(finish) if isinstance(result, hpccoll.Request) else finish(result)


def chain_shift(x, comm=None, *, step=1, out=None, async_op=False):
    """Pass every rank's block ``step`` ranks on along a chain: rank ``r`` gets rank ``r - step``'s, or zeros.

    Parameters
    ----------
    x : array_like
        This rank's block.
    comm : Communicator, mpi4py.MPI.Intracomm or None
        The ranks, in chain order; ``None`` is the world.
    step : int
        How many ranks on each block moves (at least 1).
    out : array, optional
        Where to write the result.
    async_op : bool
        Return a request.
    """
    c = as_communicator(comm)
    result = hpccoll.shift(x, c, offset=_step_of(step), out=out, async_op=async_op)
    return _zeroed(result, c.rank < step)


def chain_shift_adjoint(y, comm=None, *, step=1, out=None, async_op=False):
    """Adjoint of :func:`chain_shift`: rank ``r`` gets rank ``r + step``'s ``y``, or zeros."""
    c = as_communicator(comm)
    result = hpccoll.shift_adjoint(y, c, offset=_step_of(step), out=out, async_op=async_op)
    return _zeroed(result, c.rank >= c.size - step)


@pytest.fixture
def chain(monkeypatch):
    """``chain_shift``'s pair registered as every other pair is (PAIRS, PAIR, HOOKS, the hpccoll namespace)."""
    pair = _api.Pair(chain_shift, chain_shift_adjoint, "ChainShift")
    hooks = _spec.Hooks(
        "chain_shift", _configure, _spec.same_shape(_configure), "sendrecv", _peers, lambda size: {"step": 1}
    )
    monkeypatch.setattr(_api, "PAIRS", _api.PAIRS + (pair,))
    monkeypatch.setitem(_api.PAIR, "chain_shift", pair)
    monkeypatch.setitem(_spec.HOOKS, "chain_shift", hooks)
    monkeypatch.setattr(hpccoll, "chain_shift", chain_shift, raising=False)
    monkeypatch.setattr(_operators, "_DERIVED", {})
    return pair


def expected(G, r, step):
    """Rank ``r``'s chain shift of the global array ``G`` (leading rank axis), in NumPy."""
    return G[r - step].copy() if r >= step else np.zeros_like(G[r])


def expected_adjoint(G, r, step):
    return G[r + step].copy() if r + step < len(G) else np.zeros_like(G[r])


# --------------------------------------------------------------------------- the operator


def test_derived_operator_class(chain):
    from hpccoll._operators import ChainShift

    assert ChainShift.pair is chain and ChainShift.__name__ == "ChainShift"
    assert issubclass(ChainShift, hpccoll.Operator)
    assert str(inspect.signature(ChainShift)) == "(comm=None, *, step=1) -> None"
    doc = ChainShift.__doc__
    assert doc.startswith("Pass every rank's block ``step`` ranks on along a chain")
    assert ":func:`~hpccoll.chain_shift_adjoint`" in doc
    assert "step : int\n    How many ranks on each block moves (at least 1)." in doc
    assert "comm : Communicator, mpi4py.MPI.Intracomm or None\n" in doc and "out :" not in doc
    from hpccoll._operators import ChainShift as again

    assert again is ChainShift  # derived once
    with pytest.raises(AttributeError, match="NoSuchOperator"):
        _operators.NoSuchOperator  # noqa: B018


def test_derived_operator_refuses_what_configure_refuses(comm, chain):
    from hpccoll._operators import ChainShift

    raises_everywhere(comm, ArgumentError, r"step: expected an int >= 1; got 0", lambda: ChainShift(comm, step=0))
    raises_everywhere(comm, ArgumentError, r"step: expected an int >= 1; got 'a'", lambda: ChainShift(step="a"))
    raises_everywhere(comm, TypeError, "offset", lambda: ChainShift(comm, offset=1))


@pytest.mark.parametrize("step", [1, 2])
def test_derived_operator_against_numpy(comm, chain, step):
    from hpccoll._operators import ChainShift

    P, r = comm.size, comm.rank
    G, C = make((P,) + SHAPE, np.float64, 3), make((P,) + SHAPE, np.float64, 4)
    op = ChainShift(comm, step=step)
    agree(comm, repr(op) == f"ChainShift(step={step}, size={P})" and repr(op.H) == f"{op!r}.H", repr(op))
    agree(comm, op.step == step and op.H.H is op, "op.step, op.H.H")
    y = op(G[r])
    assert_same(y, expected(G, r, step), comm)
    assert_same(op.adjoint(C[r]), expected_adjoint(C, r, step), comm)
    assert_same(op.H(C[r]), expected_adjoint(C, r, step), comm)
    out = np.full(SHAPE, np.nan)
    agree(comm, op.forward(G[r], out=out) is out, "out")
    assert_same(out, expected(G, r, step), comm)
    assert_same(op.plan(G[r])(), expected(G, r, step), comm)
    assert_same(op.plan_adjoint(C[r])(), expected_adjoint(C, r, step), comm)
    assert_same(op.H.plan(C[r])(), expected_adjoint(C, r, step), comm)
    # the adjoint under the inner product summed over ranks: <op x, c> == <x, op.H c>
    left = comm.mpi.allreduce(float(np.vdot(y, C[r])))
    right = comm.mpi.allreduce(float(np.vdot(G[r], op.H(C[r]))))
    agree(comm, np.isclose(left, right, rtol=1e-12), f"{left} != {right}")
    agree(comm, np.array_equal(G, make((P,) + SHAPE, np.float64, 3)), "the input was modified")


def test_adjoint_of_a_derived_pair(comm, chain):
    from hpccoll._operators import ChainShift

    op = ChainShift(comm, step=1)
    agree(comm, hpccoll.adjoint_of(op).H is op, "adjoint_of(op)")
    agree(comm, hpccoll.adjoint_of(chain_shift) is chain_shift_adjoint, "adjoint_of(chain_shift)")
    agree(comm, hpccoll.adjoint_of(chain_shift_adjoint) is chain_shift, "adjoint_of(chain_shift_adjoint)")
    P, r = comm.size, comm.rank
    C = make((P,) + SHAPE, np.float32, 5)
    back = hpccoll.adjoint_of(functools.partial(chain_shift, comm=comm, step=1))
    assert_same(back(C[r]), expected_adjoint(C, r, 1), comm)


def test_adjoint_of_names_the_registered_pairs(comm, chain):
    raises_everywhere(
        comm, ArgumentError, r"\(all_gather, .*shift, .*chain_shift, their", lambda: hpccoll.adjoint_of(len)
    )


# --------------------------------------------------------------------------- explain


@pytest.mark.parametrize("form", ["one", "list"])
def test_explain_a_derived_pair_as_shift(comm, chain, form):
    x = make(SHAPE, np.float32, 6) if form == "one" else [make(SHAPE, np.float32, 6), np.zeros(0), np.ones(5, bool)]
    got, shift = comm.explain(x, "chain_shift"), comm.explain(x, "shift")
    agree(comm, got.collective == "chain_shift", got.collective)
    mine = {k: v for k, v in got.__dict__.items() if k != "collective"}
    theirs = {k: v for k, v in shift.__dict__.items() if k != "collective"}
    agree(comm, mine == theirs, lambda: f"{mine} != {theirs}")
    nbytes = sum(a.nbytes for a in (x if form == "list" else [x]))
    agree(comm, got.nbytes == nbytes, f"{got.nbytes} != {nbytes}")
    if form == "list" and comm.size > 1:  # one message per array with elements
        agree(comm, [b.arrays for b in got.buckets] == [(0,), (2,)], repr(got.buckets))


def test_explain_names_the_registered_pairs(comm, chain):
    x = np.ones(4)
    raises_everywhere(comm, ArgumentError, r"expected one of .*'shift', .*'chain_shift'; got 'nope'",
                      lambda: comm.explain(x, "nope"))  # fmt: skip


# --------------------------------------------------------------------------- the bench row


def _args(*extra):
    return _bench.parser().parse_args(
        ["--collective", "chainshift", "-b", "64", "-e", "512", "-f", "8", "-n", "1", "-w", "0", "--rounds", "1"]
        + list(extra)
    )


@pytest.mark.parametrize("extra", [[], ["-z", "0", "--baseline"], ["--list", "2", "-d", "int16", "--baseline"]])
def test_bench_row_of_a_derived_pair(comm, chain, extra):
    agree(comm, "chainshift" in _bench.collectives() and "chain_shift" not in _bench.collectives(), "the CLI name")
    args = _args(*extra)
    rows = _bench.run(args, comm, lambda line: None)
    agree(comm, [r["collective"] for r in rows] == ["chainshift"] * 2, repr(rows))
    for row in rows:
        agree(comm, row["oop"]["wrong"] == 0 and row["ip"]["wrong"] == 0, repr(row))
        agree(comm, row["redop"] == "none" and row["root"] == -1, repr(row))
        agree(comm, row["oop"]["busbw"] == pytest.approx(row["oop"]["algbw"]), repr(row))  # nccl-tests' sendrecv
        if "--baseline" in extra:  # the raw Sendrecv from the peers (nothing to or from MPI.PROC_NULL)
            agree(comm, row["baseline_us"] > 0, repr(row))


@pytest.mark.parametrize("step", [1, 2])
def test_bench_expects_what_numpy_says(comm, chain, monkeypatch, step):
    """The case's inputs and expected values, gathered from every rank, against NumPy's chain shift."""
    monkeypatch.setitem(
        _spec.HOOKS, "chain_shift", _spec.HOOKS["chain_shift"]._replace(example=lambda P: {"step": step})
    )
    case = _bench.Case("chainshift", 64, _args("--list", "2"), comm, np)
    P, r = comm.size, comm.rank
    for a in case.arrays:
        G = np.stack(comm.mpi.allgather(a.x))
        assert_same(a.want, expected(G, r, step), comm)
        agree(comm, len(np.unique(G.reshape(P, -1), axis=0)) == P, "every rank's input differs")
    agree(comm, case.peers == _peers(r, P, {"step": step}) and case.wrong(False) == 0, repr(case.peers))


def test_bench_counts_a_wrong_pair(comm, chain, monkeypatch):
    """A forward that moves the ring's data instead of the chain's (rank 0 gets the last rank's, not zeros)."""
    monkeypatch.setattr(hpccoll, "chain_shift", lambda x, c, *, step, out, **kw: hpccoll.shift(x, c, out=out, **kw))
    rows = _bench.run(_args(), comm, lambda line: None)
    wrong = sum(r["oop"]["wrong"] for r in rows)  # every rank's, summed by the bench
    agree(comm, wrong > 0, f"#wrong {wrong}")
