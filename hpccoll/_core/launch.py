"""Launching transport primitives: blocking or not, one call or a list's buckets, and scratch memory."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from .._request import DONE, Pending, Request
from ..transports._cuda import get_runtime

__all__ = ["launch", "start", "finish_all", "done", "then", "scratch", "SCRATCH_BYTES"]


def launch(transport: Any, primitive: str, args: tuple, finish: Callable[[], Any], async_op: bool) -> Any:
    """Run a transport primitive; blocking: ``finish()``, else a :class:`Request` that finishes later."""
    if not async_op:
        getattr(transport, primitive)(*args)
        return finish()
    return Request([getattr(transport, "i" + primitive)(*args)], transport.bind_finish(finish))


def start(transport: Any, primitive: str, args: tuple, async_op: bool) -> Pending:
    """Run a primitive (blocking) or start it (``async_op``); a :class:`Pending` either way."""
    if async_op:
        return getattr(transport, "i" + primitive)(*args)
    getattr(transport, primitive)(*args)
    return DONE


def finish_all(transport: Any, pending: Sequence[Pending], finishers: Sequence[Callable[[], None]], results: Any,
               async_op: bool) -> Any:
    """``results`` once every pending call completed and every finisher ran (a Request if ``async_op``).

    The finishers are bound to ``transport`` like :func:`launch`'s (``Transport.bind_finish``).
    """
    def finish() -> Any:
        for f in finishers:
            f()
        return results

    if async_op:
        return Request(list(pending), transport.bind_finish(finish))
    for p in pending:
        p.wait()
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
    pair: List[np.ndarray] = c.state.get("list scratch")
    if pair is None or pair[0].nbytes < nbytes:
        if nbytes > SCRATCH_BYTES:
            return None
        size = min(max(1 << (nbytes - 1).bit_length(), 1 << 16), SCRATCH_BYTES)
        pair = c.state["list scratch"] = (np.empty(size, np.uint8), np.empty(size, np.uint8))
    return pair
