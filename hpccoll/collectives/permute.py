"""permute: every rank's block to the rank a permutation names; one array or a list, blocking or not.

JAX's ``ppermute`` for arrays: ``perm`` is a set of ``(source, dest)`` pairs,
no rank twice a source or twice a destination. Rank ``d`` gets the ``x`` of
the rank that sends to it; a rank that receives nothing gets zeros. The
adjoint of a permutation is its inverse: the same pairs reversed (a rank
that sent nothing gets zeros back). A pipeline's step is
``perm=[(i, i + 1) for i in range(P - 1)]``, the first stage receiving
zeros; :func:`hpccoll.shift` is the permutation of the whole ring.

It moves as ``shift`` does, by the transport's ``sendrecv``
(:func:`hpccoll.collectives.shift.exchange`): at most one message to the
rank's destination and one from its source per array. Every rank passes the
same ``perm`` (check mode, ``HPCCOLL_CHECK=1``, compares it, and the
arrays' shapes and dtypes, across ranks).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .._errors import ArgumentError, HpccollError
from .._spec import Hooks, register, same_shape
from .shift import common, exchange

__all__ = ["permute", "perm_of", "PERMUTE"]

Perm = Tuple[Tuple[int, int], ...]


def perm_of(perm: Any, size: int) -> Perm:
    """``perm`` checked on ``size`` ranks: ``(source, dest)`` pairs of ranks, each rank at most once on each side;
    sorted (a permutation is a set of pairs)."""
    try:
        pairs = [tuple(p) for p in perm]
    except TypeError:
        pairs = None
    if pairs is None or isinstance(perm, (str, bytes)) or any(len(p) != 2 for p in pairs):
        raise ArgumentError(f"perm: expected a sequence of (source, dest) pairs of ranks; got {perm!r}")
    for p in pairs:
        if not all(isinstance(r, (int, np.integer)) and not isinstance(r, (bool, np.bool_)) for r in p):
            raise ArgumentError(f"perm: expected (source, dest) pairs of ints; got the pair {p!r}")
        if not all(0 <= r < size for r in p):
            raise ArgumentError(f"perm: expected ranks in [0, {size}); got the pair {tuple(map(int, p))}")
    result = tuple(sorted((int(s), int(d)) for s, d in pairs))
    for side, name in ((0, "source"), (1, "destination")):
        ranks = [p[side] for p in result]
        twice = next((r for r in ranks if ranks.count(r) > 1), None)
        if twice is not None:
            raise ArgumentError(f"perm: expected each rank at most once as a {name}; got rank {twice} twice")
    return result


def _peers(perm: Perm, rank: int) -> Tuple[Optional[int], Optional[int]]:
    """``(to, source)`` of ``rank`` under ``perm`` (``None``: no message that way)."""
    to = next((d for s, d in perm if s == rank), None)
    source = next((s for s, d in perm if d == rank), None)
    return to, source


def permute(x: Any, c: Any, perm: Any, out: Any, what: str, async_op: bool, adjoint: bool) -> Any:
    """``hpccoll.permute`` (``adjoint``: every pair reversed), one array or a list; ``what`` names the public call."""
    err: Optional[HpccollError] = None
    pairs: Perm = ()
    try:
        pairs = perm_of(perm, c.size)
    except HpccollError as e:
        err = e
    if adjoint:
        pairs = tuple(sorted((d, s) for s, d in pairs))
    to, source = _peers(pairs, c.rank)
    if (
        err is None
        and to is not None
        and source is not None
        and to != c.rank
        and type(x) is np.ndarray
        and not c.check
        and x.size
        and x.flags.c_contiguous
    ):
        result = common(x, c, to, source, out, async_op)
        if result is not None:
            return result
    # named by the messages, not the call: permute_adjoint(perm) sends what permute(reversed perm) sends
    moves = any(s != d for s, d in pairs)
    config = {"perm": [list(p) for p in pairs]}
    return exchange(x, c, (to, source), moves, out, what, async_op, err, "permute", config)


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    if "perm" not in keywords:
        raise ArgumentError("perm: expected a sequence of (source, dest) pairs of ranks; got none")
    return {**keywords, "perm": perm_of(keywords["perm"], comm.size)}


#: permute's spec: ``perm`` checked; the result has the input's shape; at most one message each way.
PERMUTE = register(
    Hooks(
        "permute",
        _configure,
        same_shape(_configure),
        "sendrecv",
        lambda rank, size, keywords: _peers(keywords["perm"], rank),  # keywords configured: perm checked
        lambda size: {"perm": [(i, i + 1) for i in range(size - 1)]},
    )
)
