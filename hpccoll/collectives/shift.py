"""shift: every rank passes its block ``offset`` ranks along the ring; one array or a list, blocking or not.

Rank ``r`` receives the ``x`` of rank ``(r - offset) mod P``: the ring step of
sequence-parallel attention, pipelines and systolic algorithms. The shift is a
permutation of the ranks' blocks, so its adjoint is its inverse, the shift by
``-offset``.

It is one ``sendrecv`` of the transport contract, the primitive the halo
exchange uses: one message to ``(r + offset) mod P`` and one from
``(r - offset) mod P`` per array, matched in list order. Host MPI posts an
``Irecv``/``Isend`` pair (persistent requests in a plan), NCCL a grouped
send/recv, and the contract's default (``staged``) one all-to-all of the
packed bytes. With ``transport="shm"``, arrays in node-shared memory
(:meth:`hpccoll.Communicator.shared_empty`) are read straight from the
sender's memory. The message is sent from ``x`` itself where ``x`` is
C-contiguous and not also ``out``; in place, ``x`` is copied first (MPI may not
send from and receive into one buffer).

Every rank's arrays must have one shape and dtype (the ring moves blocks, it
does not reshape them); check mode (``HPCCOLL_CHECK=1``) compares them, and
``offset``, across ranks.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._arrays import module_of
from .._core.agree import descriptor, settle
from .._core.blocks import ALL, in_place_test, is_in_place, may_share
from .._core.launch import Ready, done, launch
from .._core.lists import list_types, survey_list
from .._core.validate import check_out, one_array, outs_of, plain_out
from .._dtypes import wire_of
from .._errors import ArgumentError, HpccollError
from .._spec import Hooks, register, same_shape

__all__ = ["shift", "exchange", "common", "offset_of", "SHIFT"]


def offset_of(offset: Any) -> int:
    """``offset`` checked: an int (any sign; taken modulo the communicator's size)."""
    if isinstance(offset, (int, np.integer)) and not isinstance(offset, (bool, np.bool_)):
        return int(offset)
    raise ArgumentError(f"offset: expected an int; got {offset!r}")


def _configure(comm: Any, keywords: Dict[str, Any]) -> Dict[str, Any]:
    return {**keywords, "offset": offset_of(keywords.get("offset", 1))}


def _peers(rank: int, size: int, keywords: Dict[str, Any]) -> Tuple[int, int]:
    step = keywords["offset"] % size
    return (rank + step) % size, (rank - step) % size


#: The shift's spec: ``offset`` checked; the result has the input's shape; one message each way.
SHIFT = register(Hooks("shift", _configure, same_shape(_configure), "sendrecv", _peers, lambda size: {"offset": 1}))


def shift(x: Any, c: Any, offset: Any, out: Any, what: str, async_op: bool, adjoint: bool) -> Any:
    """``hpccoll.shift`` (``adjoint``: the shift by ``-offset``), one array or a list; ``what`` names the public call."""
    if type(x) is np.ndarray and type(offset) is int and not c.check and c.size > 1 and x.size and x.flags.c_contiguous:
        step = (-offset if adjoint else offset) % c.size
        if step:
            result = common(x, c, (c.rank + step) % c.size, (c.rank - step) % c.size, out, async_op)
            if result is not None:
                return result
    err, step = None, 0
    try:
        step = (-offset_of(offset) if adjoint else offset_of(offset)) % c.size
    except HpccollError as e:
        err = e
    # named by the messages, not the call: shift_adjoint(offset=-k) sends what shift(offset=k) sends
    config = {"offset": step}
    return exchange(x, c, _peers(c.rank, c.size, config), step != 0, out, what, async_op, err, "shift", config)


def exchange(
    x: Any,
    c: Any,
    peers: Tuple[Optional[int], Optional[int]],
    moves: bool,
    out: Any,
    what: str,
    async_op: bool,
    err: Optional[HpccollError],
    name: str,
    config: Dict[str, Any],
) -> Any:
    """Send every array of ``x`` (one, or a list) to ``peers[0]`` and receive each ``out`` from ``peers[1]``.

    ``None`` for a peer: no message that way (an ``out`` that receives nothing
    gets zeros); this rank for both: a local copy. ``moves``: whether any rank
    sends to another (the same on every rank, from the configuration); where
    one does, every rank calls the transport's ``sendrecv``, as its contract
    asks, with empty lists where it has nothing to move. ``err``: an error the
    caller found in its own arguments. Check mode compares the descriptor
    ``name`` with ``config`` and the arrays' dtypes and shapes across ranks.
    """
    many = type(x) is not np.ndarray and list_types(x) is not None
    desc = None
    arrays: List[Any] = []
    outs: List[Any] = []
    kind = "numpy"
    try:
        if err is not None:
            raise err
        if many:
            lst = survey_list(x, list_types(x) or set(), async_op)
            arrays, kind = lst.arrays, lst.kind
            wanted = outs_of(out, len(arrays))
        else:
            a, kind, _ = one_array(x)
            arrays, wanted = [a], [out]
        xp = module_of(kind)
        outs = [check_out(o, a.shape, a.dtype, a, xp, in_place_test(a, ALL)) for a, o in zip(arrays, wanted)]
        if c.check:
            desc = descriptor(name, **config, arrays=[(a.dtype.name, a.shape) for a in arrays])
    except HpccollError as e:
        err = e
    settle(c, what, desc, None, err, async_op)
    result = outs if many else outs[0]
    to, source = peers
    kept: List[Tuple[Any, Any]] = []  # (x, out) where this rank keeps its own block
    zeros: List[Any] = []  # the outs of a rank that receives nothing
    sends: List[Tuple[Any, int]] = []
    recvs: List[Tuple[Any, int]] = []
    landing: List[Tuple[Any, Any]] = []  # (received buffer, out) where out is not C-contiguous
    for a, o in zip(arrays, outs):
        if to == c.rank:
            kept.append((a, o))
            continue
        if source is None:
            zeros.append(o)
        if not a.size or not moves:
            continue  # every rank's array has this shape: nobody sends it
        if to is not None:
            send = a.reshape(-1)  # a view where a is C-contiguous, else a copy in C order
            if a.flags.c_contiguous and is_in_place(o, a, ALL):  # MPI may not send from the buffer it receives into
                send = send.copy()
            sends.append((send, to))
        if source is None:
            continue
        if o.flags.c_contiguous:
            recvs.append((o.reshape(-1), source))
        else:
            buf = xp.empty(o.size, o.dtype)
            recvs.append((buf, source))
            landing.append((buf, o))

    def finish() -> Any:
        for buf, o in landing:
            o[...] = buf.reshape(o.shape)
        for a, o in kept:
            if o is not a:
                xp.copyto(o, a)
        for o in zeros:
            o.fill(0)
        return result

    if not moves or c.size == 1 or not any(a.size for a in arrays):  # the same on every rank: nobody sends
        return done(finish(), async_op, kind)
    # sized: without check mode no agreement fixed the messages' sizes (host MPI compares them with the receives')
    then = Ready(result) if not (landing or kept or zeros) else finish
    return launch(c.transport_of(kind), "sendrecv", (sends, recvs, True), then, async_op)


def common(x: np.ndarray, c: Any, to: int, source: int, out: Any, async_op: bool) -> Any:
    """The common case, the same messages with the fewest Python steps: a C-contiguous NumPy ``x`` (not
    empty) of a supported dtype sent to ``to`` and received from ``source`` (other ranks), ``out`` absent or
    a separate plain array; ``None`` where :func:`exchange` must decide (in place, other layouts, errors)."""
    if wire_of(x.dtype) is None:  # an unsupported dtype: the general path refuses it
        return None
    if out is None:
        out = np.empty(x.shape, x.dtype)
    elif not plain_out(out, x.shape, x.dtype) or may_share(out, x):
        return None
    args = (((x.reshape(-1), to),), ((out.reshape(-1), source),), True)
    t = c.transport_of("numpy")
    if async_op:
        return launch(t, "sendrecv", args, Ready(out), True)
    t.sendrecv(*args)
    return out
