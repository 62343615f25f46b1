"""Handles of non-blocking collectives."""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["Request", "Pending", "DONE"]


class Pending:
    """A transport operation in flight: the contract's non-blocking result.

    Transports return an object with ``wait()`` (block until complete) and
    ``test()`` (``True`` once complete, without blocking).
    """

    def wait(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def test(self) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class _Done(Pending):
    def wait(self) -> None:
        return None

    def test(self) -> bool:
        return True


#: A transport operation that completed before it was returned.
DONE = _Done()


class Request:
    """A non-blocking hpccoll collective in flight (returned with ``async_op=True``).

    The input and output buffers belong to the collective until :meth:`wait`
    returns (or :meth:`test` returns ``True``): do not modify the input or
    read the output before then. The request holds a reference to every
    buffer it handed the transport (the input or its packed copy, the output
    or its receive buffer) until it completes: MPI may read and write them
    until then, and mpi4py keeps no reference of its own for most
    non-blocking collectives (``Iallreduce``, ``Iallgatherv``,
    ``Ireduce_scatter(_block)``, as of mpi4py 4.1). Dropping the caller's
    own references before :meth:`wait` is safe.

    Examples
    --------
    >>> req = hpccoll.all_reduce(grad, comm, async_op=True)   # doctest: +SKIP
    >>> do_other_work()                                         # doctest: +SKIP
    >>> total = req.wait()                                      # doctest: +SKIP
    """

    __slots__ = ("_pending", "_finish", "_result", "_done", "_owned")

    def __init__(self, pending: Sequence[Pending], finish: Callable[[], Any], owned: Any = None) -> None:
        self._pending = list(pending)
        self._finish = finish
        self._result: Any = None
        self._done = False
        self._owned = owned  # what the transport was handed, alive until completion

    @classmethod
    def completed(cls, result: Any) -> "Request":
        """A request that has already finished with ``result``."""
        req = cls([], lambda: result)
        req._complete()
        return req

    def _complete(self) -> None:
        self._result = self._finish()
        self._done = True
        self._pending = []
        self._finish = None
        self._owned = None

    def test(self) -> bool:
        """Whether the collective has completed (finishing it if so); never blocks."""
        if not self._done:
            self._pending = [p for p in self._pending if not p.test()]
            if not self._pending:
                self._complete()
        return self._done

    def wait(self) -> Any:
        """Block until the collective completes; return its result (as the blocking call would)."""
        if not self._done:
            for p in self._pending:
                p.wait()
            self._complete()
        return self._result

    @property
    def done(self) -> bool:
        """``True`` once :meth:`wait` or a successful :meth:`test` has finished the collective."""
        return self._done

    def then(self, fn: Callable[[Any], Any]) -> "Request":
        """A request whose result is ``fn(result)`` (used to chain adjoint post-processing)."""
        if self._done:
            return Request.completed(fn(self._result))
        finish = self._finish
        self._finish = lambda: fn(finish())
        return self

    def __repr__(self) -> str:
        return f"<hpccoll.Request {'done' if self._done else 'pending'}>"
