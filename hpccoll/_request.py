"""Handles of non-blocking collectives."""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

__all__ = ["Request", "Pending", "DONE"]

#: What a request's :meth:`Request.wait` returns: the blocking call's result.
ResultT = TypeVar("ResultT")
#: The result of a request made by :meth:`Request.then`.
OtherT = TypeVar("OtherT")


class Pending:
    """A transport operation in flight: the contract's non-blocking result.

    Transports return an object with ``wait()`` (block until complete) and
    ``test()`` (``True`` once complete, without blocking).
    """

    def wait(self) -> None:  # pragma: no cover - interface
        """Block until the operation completes."""
        raise NotImplementedError

    def test(self) -> bool:  # pragma: no cover - interface
        """Whether the operation has completed; never blocks.

        Returns
        -------
        bool
            ``True`` once it has completed.
        """
        raise NotImplementedError


class _Done(Pending):
    def wait(self) -> None:
        return None

    def test(self) -> bool:
        return True


#: A transport operation that completed before it was returned.
DONE = _Done()


class Request(Generic[ResultT]):
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

    ``Request[R]`` is the type of a request whose :meth:`wait` returns ``R``
    (an array, or a list of arrays for the list forms).

    Parameters
    ----------
    pending : sequence of Pending
        The transport operations in flight.
    finish : callable
        Called once they have all completed; its return value is the result.
    owned : object, optional
        What the transport was handed (buffers, packed copies), kept alive
        until completion.

    Examples
    --------
    >>> req = hpccoll.all_reduce(grad, comm, async_op=True)   # doctest: +SKIP
    >>> do_other_work()                                         # doctest: +SKIP
    >>> total = req.wait()                                      # doctest: +SKIP
    """

    __slots__ = ("_pending", "_finish", "_result", "_done", "_owned")

    def __init__(self, pending: Sequence[Pending], finish: Callable[[], ResultT], owned: Any = None) -> None:
        self._pending = list(pending)
        self._finish: Optional[Callable[[], Any]] = finish  # None once complete
        self._result: Any = None
        self._done = False
        self._owned = owned  # what the transport was handed, alive until completion

    @classmethod
    def completed(cls, result: ResultT) -> Request[ResultT]:
        """A request that has already finished.

        Parameters
        ----------
        result : object
            What its :meth:`wait` returns.

        Returns
        -------
        Request
            A finished request.
        """
        req = cls([], lambda: result)
        req._complete()
        return req

    def _complete(self) -> None:
        assert self._finish is not None, "a request completes once"
        self._result = self._finish()
        self._done = True
        self._pending = []
        self._finish = None
        self._owned = None

    def test(self) -> bool:
        """Whether the collective has completed (finishing it if so); never blocks.

        Returns
        -------
        bool
            ``True`` once the collective has completed; its result is then
            ready for :meth:`wait`, which no longer blocks.
        """
        if not self._done:
            self._pending = [p for p in self._pending if not p.test()]
            if not self._pending:
                self._complete()
        return self._done

    def wait(self) -> ResultT:
        """Block until the collective completes; return its result (as the blocking call would).

        Returns
        -------
        array or list of arrays
            The collective's result; every later call returns the same object.
        """
        if not self._done:
            for p in self._pending:
                p.wait()
            self._complete()
        return self._result

    @property
    def done(self) -> bool:
        """``True`` once :meth:`wait` or a successful :meth:`test` has finished the collective."""
        return self._done

    def then(self, fn: Callable[[ResultT], OtherT]) -> Request[OtherT]:
        """A request whose result is ``fn(result)`` (used to chain adjoint post-processing).

        Parameters
        ----------
        fn : callable
            Applied to this request's result when it completes.

        Returns
        -------
        Request
            A finished request when this one has finished; else this request,
            whose :meth:`wait` now returns ``fn(result)``.
        """
        if self._done:
            return Request.completed(fn(self._result))
        finish = self._finish
        assert finish is not None
        self._finish = lambda: fn(finish())
        chained: Request[Any] = self  # the same request, its result now fn's
        return chained

    def __repr__(self) -> str:
        return f"<hpccoll.Request {'done' if self._done else 'pending'}>"
