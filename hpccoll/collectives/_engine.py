"""The one road of a collective's general branch: validate -> agree -> one-rank shortcut -> transport -> step.

A collective declares its road once (:class:`Road`: the hooks that are truly
its own) and its general branch is ``run(road, c, what, async_op, *args)``,
for one array and a list alike. What every collective used to restate lives
here: a bad argument becomes one exception on every rank (check mode agrees
on it and on the call's descriptor first), one rank copies without moving,
and the transport is picked from the message size every rank measures alike.
The common-case fast paths (each module's ``_common``) stay beside their
collective, in front of this road.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .._core.agree import settle
from .._core.launch import Batch, done
from .._errors import HpccollError

__all__ = ["Call", "Road", "run", "agreed", "copied", "in_buckets"]


class Call(NamedTuple):
    """One call's arguments, checked: what the engine and a collective's hooks read.

    A list form holds its :class:`~hpccoll._core.lists.ListOf` in ``x``, its
    outs in ``out``, its axes in ``ax`` and its per-array extents in ``sizes``.
    """

    x: Any
    kind: str
    xp: Any
    out: Any
    #: The message size as every rank measures it alike (``Communicator.transport_of``).
    nbytes: int
    #: Check mode's descriptor (``None`` outside check mode).
    desc: Any = None
    op: Any = None
    ax: Any = None
    sizes: Any = None
    root: int = 0
    #: What else a collective's hooks carry from ``check`` to ``move`` (all-to-all's receive extents).
    extra: Any = None


class Road(NamedTuple):
    """A collective's own hooks on the road :func:`run` takes."""

    #: ``check(c, async_op, *args)``: the checked :class:`Call`; raises :class:`HpccollError` for a bad argument.
    check: Callable[..., Call]
    #: ``alone(call)``: the result on a one-rank communicator (no transport).
    alone: Callable[[Call], Any]
    #: ``move(call, c, transport, async_op)``: the result, or a :class:`~hpccoll.Request` for it.
    move: Callable[[Call, Any, Any, bool], Any]
    #: The transport primitive that moves the call; ``None`` for a list's several calls.
    primitive: Optional[str] = None
    #: ``agree(call, c, what, err, async_op)``: the agreed :class:`Call`, where the ranks must exchange more
    #: than check mode's descriptor (extents the call learns); ``None``: :func:`settle` the descriptor.
    agree: Optional[Callable[[Optional[Call], Any, str, Optional[HpccollError], bool], Call]] = None
    #: An empty message takes the one-rank shortcut too (the rooted collectives': nothing to move).
    alone_empty: bool = False


def run(road: Road, c: Any, what: str, async_op: bool, *args: Any) -> Any:
    """One call of ``road`` on ``c`` (``what`` names the public call in errors): its result, or a Request."""
    call = agreed(road, c, what, async_op, *args)
    if c.size == 1 or (road.alone_empty and not call.nbytes):
        return done(road.alone(call), async_op, call.kind)
    transport = c.transport_of(call.kind, call.nbytes, road.primitive, not async_op)  # collective on first GPU use
    return road.move(call, c, transport, async_op)


def agreed(road: Road, c: Any, what: str, async_op: bool, *args: Any) -> Call:
    """``road.check(c, async_op, *args)``, agreed with the other ranks: a bad argument on any rank raises on all."""
    err = call = None
    try:
        call = road.check(c, async_op, *args)
    except HpccollError as e:
        err = e
    if road.agree is not None:
        call = road.agree(call, c, what, err, async_op)
    else:
        settle(c, what, None if call is None else call.desc, None, err, async_op)
    assert call is not None, "an error was raised on every rank"
    return call


def copied(a: Call) -> Any:
    """The one-rank result of a collective that moves data: ``x`` copied into ``out``."""
    a.xp.copyto(a.out, a.x)
    return a.out


def in_buckets(
    c: Any,
    kind: str,
    async_op: bool,
    results: List[Any],
    groups: Iterable[Tuple[Any, Sequence[int], Sequence[range]]],
    bucket: Callable[[Any, Sequence[int], bool], Tuple[str, tuple, Callable[[], None]]],
) -> Any:
    """The list forms' one bucket loop: ``results`` (a :class:`Request` for them if ``async_op``).

    ``groups``: ``(key, members, parts)``, the positions of the arrays moved
    alike (one dtype's) and their buckets (:func:`hpccoll._layout.buckets`
    over ``members``). ``bucket(key, idx, whole)`` packs the arrays of ``idx``
    and returns the transport call that moves them, ``(primitive, args,
    finish)``; ``whole``: ``idx`` is the one bucket of every array. Each call
    picks its own transport, and the finishers fill ``results`` once every
    call is done (:class:`~hpccoll._core.launch.Batch`).
    """
    batch = Batch(c, kind, async_op)
    for key, members, parts in groups:
        whole = len(parts) == 1 and len(members) == len(results)
        for part in parts:
            batch.start(*bucket(key, members if len(part) == len(members) else [members[j] for j in part], whole))
    return batch.finish(results)
