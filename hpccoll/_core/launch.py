"""Launching transport primitives: blocking or not, one call or a list's buckets, and scratch memory."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .._request import Pending, Request
from ..transports._base import measured
from ..transports._cuda import get_runtime

__all__ = ["launch", "Batch", "Ready", "done", "then", "scratch", "SCRATCH_BYTES"]


class Ready:
    """A finishing step with nothing left to do: the result is ``out`` once the transport call completed.

    A callable like any other finishing step; a plan (:func:`hpccoll.plan`)
    that sees one returns ``out`` straight after the call, with no step between.
    """

    __slots__ = ("out",)

    def __init__(self, out: Any) -> None:
        self.out = out

    def __call__(self) -> Any:
        return self.out


def launch(transport: Any, primitive: str, args: tuple, finish: Callable[[], Any], async_op: bool) -> Any:
    """Run a transport primitive; blocking: ``finish()``, else a :class:`Request` that finishes later
    (and owns ``args``, the buffers MPI may still read and write, until then)."""
    if not async_op:
        getattr(transport, primitive)(*args)
        return finish()
    return Request([getattr(transport, "i" + primitive)(*args)], transport.bind_finish(finish), args)


class Batch:
    """The transport calls of one list collective: run or started one by one, finished together.

    Each call goes to the transport the communicator's selector picks for
    it (``c.transport_of``: its primitive and size, every rank alike).
    ``async_op``: each call is started, and the :class:`Request` that
    :meth:`finish` returns owns every call's arguments (packed send buffers,
    receive buffers) until it completes. Blocking: each call runs at once.
    Either way the finishers run after the last call, bound to the kind's
    transport like :func:`launch`'s (``Transport.bind_finish``).
    """

    __slots__ = ("c", "kind", "async_op", "pending", "owned", "finishers")

    def __init__(self, c: Any, kind: str, async_op: bool) -> None:
        self.c = c
        self.kind = kind
        self.async_op = async_op
        self.pending: List[Pending] = []
        self.owned: List[tuple] = []
        self.finishers: List[Callable[[], None]] = []

    def start(self, primitive: str, args: tuple, finish: Callable[[], None]) -> None:
        """Run (or start) ``primitive(*args)``; ``finish`` runs once every call of the batch is done."""
        t = self.c.transport_of(self.kind, measured(primitive, args), primitive, not self.async_op)
        if self.async_op:
            self.pending.append(getattr(t, "i" + primitive)(*args))
            self.owned.append(args)
        else:
            getattr(t, primitive)(*args)
        self.finishers.append(finish)

    def finish(self, results: Any) -> Any:
        """``results`` once every finisher ran (a :class:`Request` if ``async_op``)."""
        finishers = self.finishers

        def finish() -> Any:
            for f in finishers:
                f()
            return results

        if self.async_op:
            return Request(self.pending, self.c.transport_of(self.kind).bind_finish(finish), self.owned)
        return finish()


def done(result: Any, async_op: bool, kind: str = "numpy") -> Any:
    """``result``, or a :class:`Request` holding it.

    A CuPy result was made on the current stream (a one-rank call's copy):
    the request's ``wait()`` orders the waiting stream after it.
    """
    if not async_op:
        return result
    if kind == "numpy":
        return Request.completed(result)
    return Request([], get_runtime().on_this_stream(lambda: result))


def then(result: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to a result now, or when a :class:`Request` completes."""
    return result.then(fn) if isinstance(result, Request) else fn(result)


#: Largest scratch buffer (bytes) a communicator keeps between calls of the list forms.
SCRATCH_BYTES = 4 << 20


def scratch(c: Any, nbytes: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Two byte buffers of at least ``nbytes`` kept on ``c`` (send, receive), or ``None`` above :data:`SCRATCH_BYTES`.

    MPI is much slower on freshly allocated buffers than on reused ones (with
    MPICH 5 here, 256 KiB all-reduced into a new ``numpy.empty`` takes about
    3x as long as into a reused one, even when its pages were touched first):
    the NumPy list forms pack and move in these and copy the results out.
    Freed by ``comm.free()``.
    """
    pair: Optional[Tuple[np.ndarray, np.ndarray]] = c.state.get("list scratch")
    if pair is None or pair[0].nbytes < nbytes:
        if nbytes > SCRATCH_BYTES:
            return None
        size = min(max(1 << (nbytes - 1).bit_length(), 1 << 16), SCRATCH_BYTES)
        pair = c.state["list scratch"] = (np.empty(size, np.uint8), np.empty(size, np.uint8))
    return pair
