"""Planned collectives: checked, agreed and prepared once, then run again and again (:func:`plan`).

Making a plan runs the collective's own code once, in check mode and
non-blocking, on a communicator whose transports *record* the primitive
calls instead of starting them (:class:`_Recorder`). What that run
validated, agreed and allocated is the plan's: the ranks agree on the
collective, its dtype, shapes, sizes and op (check mode's descriptors, check
mode on or not), and the recorded calls are handed to the transport once
(:meth:`~hpccoll.transports.Transport.prepare`: MPI-4 persistent requests or
prebuilt blocking calls on host MPI). A call of the plan then runs those
prepared calls and the collective's own finishing step (``avg``'s divide, an
unpacking copy), nothing else.

That replay is only right when every buffer the recorded calls read is
``x``'s own memory (its current contents are then what moves), or memory
that the collective's finishing step says it rewrites from ``x`` before the
messages (its ``refill`` and ``fills``: the halo exchange's ``out`` and the
copies of faces a transport cannot move where they lie), which the plan then
reruns before each call. Where the collective packed, widened or copied ``x``
otherwise (a non-contiguous input, an inner axis, float16 on a transport that
widens, out-of-place broadcast, list forms), or moved nothing (one rank), the
plan *calls the collective* instead,
with everything that was agreed kept (no check-mode exchange per call) and
the same ``out`` every time. Every rank makes the same choice: the ranks
agree on it when the plan is made.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _api
from ._comm import Communicator, as_communicator
from ._core.launch import Ready
from ._errors import ArgumentError, HpccollError
from ._request import DONE, Pending, Request
from .transports._base import PRIMITIVES, sent

__all__ = ["plan", "Plan", "METHODS"]

#: The ``method`` values :func:`plan` takes.
METHODS = ("auto", "blocking", "persistent")

#: The non-blocking forms of the contract's primitives.
_STARTS = frozenset("i" + p for p in PRIMITIVES)


def _public() -> Dict[str, Callable[..., Any]]:
    """Every public collective and adjoint, by name."""
    return {fn.__name__: fn for pair in _api.PAIRS for fn in (pair.forward, pair.adjoint)}


class Plan(functools.partial):
    """A collective fixed on its buffers: ``p()`` runs it on the current contents of ``x``.

    Made by :func:`hpccoll.plan` (collective). ``p()`` returns the result,
    the same array (or list) on every call; ``p.start()`` then ``p.wait()``
    is the non-blocking form. ``p.free()`` (or leaving a ``with`` block)
    releases what the plan holds (MPI persistent requests); a freed plan
    raises :class:`~hpccoll.HpccollError`. Every rank calls a plan the same
    number of times, in the same order as its other collectives, as for the
    collective itself.

    Parameters
    ----------
    collective : str
        The public function planned.
    result : array or list of arrays
        What every call returns.
    methods : tuple of str
        How each transport call runs.
    call : callable
        One run of the collective, returning ``result``.
    begin : callable
        Starts a run; its value is what ``end`` takes.
    end : callable
        Completes what ``begin`` started; returns the result.
    free : callable
        Releases the transport resources.
    steps : tuple of callable, optional
        Where a run is one transport call of one or two steps with nothing to finish: those steps
        (``call`` is then not used by ``p()``).

    Attributes
    ----------
    collective : str
        The public function planned (``"all_reduce"``, ...).
    result : array or list of arrays
        What every call returns (``out`` when given); ``None`` until the
        first call where the plan calls the collective and no ``out`` was given.
    methods : tuple of str
        How each transport call runs: ``"persistent"`` (an MPI persistent
        request), ``"blocking"`` (the blocking call, its arguments built
        once), or ``("call",)``: the plan calls the collective each time.
    """

    __slots__ = ("collective", "result", "methods", "_go", "_begin", "_end", "_pending", "_free", "_check")
    collective: str
    result: Any
    methods: Tuple[str, ...]
    _go: List[Callable[[], Any]]
    _begin: Callable[[], Any]
    _end: Callable[[Any], Any]
    _pending: Any
    _free: Optional[Callable[[], None]]
    _check: Optional[Callable[[bool], None]]

    def __new__(
        cls,
        collective: str,
        result: Any,
        methods: Tuple[str, ...],
        call: Callable[[], Any],
        begin: Callable[[], Any],
        end: Callable[[Any], Any],
        free: Callable[[], None],
        steps: Tuple[Callable[[], Any], ...] = (),
    ) -> "Plan":
        # A plan is a functools.partial of its run: calling it costs one C-level call into run (a
        # Python __call__ would add a method dispatch). go[0] is the first thing run does; free()
        # replaces it with a step that raises.
        go: List[Callable[[], Any]] = [steps[0] if steps else call]
        if steps:  # one transport call of one or two steps, nothing to finish: run makes them itself
            second = steps[1] if len(steps) > 1 else _nothing

            def run() -> Any:
                go[0]()
                second()
                return result

        else:

            def run() -> Any:
                return go[0]()

        self = super().__new__(cls, run)
        self.collective = collective
        self.result = result
        self.methods = methods
        self._go = go
        self._begin = begin
        self._end = end
        self._pending = None
        self._free = free
        self._check = None
        return self

    def _guard(self, check: Callable[[bool], None]) -> None:
        """Run ``check(freed)`` (collective: check mode's agreement) before every call and start."""
        first, begin = self._go[0], self._begin

        def guarded() -> Any:
            check(False)
            return first()

        def guarded_begin() -> Any:
            check(False)
            return begin()

        self._go[0], self._begin, self._check = guarded, guarded_begin, check

    if TYPE_CHECKING:  # what partial's call does, for the type checkers and the docs

        def __call__(self) -> Any:
            """Run the collective on the current contents of ``x``; the result (the same object every call)."""

    def start(self) -> None:
        """Start the collective (non-blocking); :meth:`wait` completes it.

        Raises
        ------
        HpccollError
            The plan was freed, or is started already.
        """
        if self._pending is not None:
            raise HpccollError(f"plan of {self.collective}: start() again before wait(); expected one start per wait")
        self._pending = self._begin()

    def wait(self) -> Any:
        """Complete what :meth:`start` started; the result, as ``p()`` returns it.

        Returns
        -------
        array or list of arrays
            The result (the same object as every call's).

        Raises
        ------
        HpccollError
            The plan was freed, or not started.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            raise HpccollError(f"plan of {self.collective}: wait() without start(); expected start() first")
        return self._end(pending)

    def free(self) -> None:
        """Release the plan's transport resources; later calls raise :class:`~hpccoll.HpccollError`.

        Not collective; freeing twice does nothing.
        """
        if self._pending is not None:
            self._end(self._pending)  # MPI frees no active request: complete it first
            self._pending = None
        free, self._free = self._free, None
        if free is None:
            return
        if self._check is None:
            self._go[0] = self._begin = functools.partial(_freed, self.collective)
        else:  # check mode: a freed plan's call takes part in the agreement, which raises on every rank
            self._go[0] = self._begin = functools.partial(self._check, True)
        free()

    @property
    def freed(self) -> bool:
        """``True`` once :meth:`free` ran."""
        return self._free is None

    def __enter__(self) -> "Plan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else "/".join(self.methods)
        return f"<hpccoll.Plan {self.collective} ({state})>"


#: A step that does nothing, at C speed (the second of a one-step call).
_nothing = ().__len__


def _freed(collective: str) -> Any:
    raise _freed_error(collective)


def _freed_error(collective: str) -> HpccollError:
    return HpccollError(f"plan of {collective}: the plan was freed; expected a live plan (make a new one)")


def plan(collective: Any, x: Any, comm: Any = None, *, out: Any = None, method: str = "auto", **options: Any) -> Plan:
    """Plan a collective on fixed buffers: validate and agree once, then run it many times (collective).

    Parameters
    ----------
    collective : callable or str
        A public collective or adjoint (``hpccoll.all_reduce``,
        ``hpccoll.halo_exchange_adjoint``, ...) or its name.
    x : array or list of arrays
        The input buffer(s). Each call of the plan reads the current
        contents of these very arrays: rebinding the name (``x = new_array``)
        leaves the plan on the old buffer, silently; copy into it instead
        (``x[...] = new_array``). Keep them alive and do not reshape or
        resize them: in check mode (``HPCCOLL_CHECK=1``) each call checks
        that they are where and as they were, on every rank.
    comm : Communicator or mpi4py communicator, optional
        As for the collective (default: the world).
    out : array or list of arrays, optional
        Where every call writes its result; allocated once when not given
        (``out=x`` where the collective allows in place).
    method : {"auto", "blocking", "persistent"}, optional
        How host MPI runs the calls: ``"persistent"``, MPI-4 persistent
        requests (``MPI_Allreduce_init``, ...; the blocking call where MPI
        lacks them); ``"blocking"``, the blocking call with its arguments built
        once; ``"auto"`` (default), whichever is faster for this call on this
        MPI: from the profile of ``python -m hpccoll tune`` when it measured
        this call, else measured when the plan is made (once per call and size
        on a communicator). Other transports run their own primitives.
    **options
        The collective's own keywords (``axis``, ``sizes``, ``op``,
        ``root``, ``halo``, ``split_axis``, ...). ``async_op`` is not one:
        use :meth:`Plan.start` and :meth:`Plan.wait`.

    Returns
    -------
    Plan
        ``p()`` runs the collective; ``p.start()``/``p.wait()``; ``p.free()``.

    Raises
    ------
    ArgumentError
        An unknown ``collective`` or ``method``, ``async_op`` among the
        options, or any argument the collective refuses: on every rank.
    HpccollError
        From a call, in check mode: ``x`` was reshaped, resized or
        reallocated since the plan was made, or the plan was freed, on some
        rank (raised on every rank).
    MismatchError
        The ranks disagree on the collective, its dtype, shapes, sizes, op or
        options (checked whether or not check mode is on), on every rank.

    Examples
    --------
    >>> partial = numpy.zeros(1)                                  # doctest: +SKIP
    >>> dot = hpccoll.plan(hpccoll.all_reduce, partial, comm)     # doctest: +SKIP
    >>> partial[0] = r @ r; rr = dot()[0]                         # doctest: +SKIP
    """
    c = as_communicator(comm)
    err: Optional[HpccollError] = None
    fns = _public()
    name = collective if isinstance(collective, str) else getattr(collective, "__name__", None)
    fn = fns.get(name) if isinstance(name, str) else None
    if fn is None or (not isinstance(collective, str) and fn is not collective):
        err = ArgumentError(
            f"collective: expected one of hpccoll's collectives or adjoints ({', '.join(sorted(fns))}); "
            f"got {collective!r}"
        )
        name = repr(collective)
    elif method not in METHODS:
        err = ArgumentError(f"method: expected one of {', '.join(map(repr, METHODS))}; got {method!r}")
    elif "async_op" in options:
        err = ArgumentError("async_op: expected no async_op among the options (use Plan.start and Plan.wait); got one")
    desc = {"collective": name, "method": method, "options": sorted((k, repr(v)) for k, v in options.items())}
    c.agree("hpccoll.plan", desc, None, err)  # the same call on every rank, and any error raised on all
    assert fn is not None and isinstance(name, str)
    return _make(c, name, fn, x, out, method, options)


def _make(c: Communicator, name: str, fn: Callable[..., Any], x: Any, out: Any, method: str, options: dict) -> Plan:
    """The plan of ``fn`` (arguments checked alike on every rank)."""
    log = _Log()
    # Check mode's agreement, once; a replicated cotangent's check compares contents, which a plan does not fix.
    content_check = name == "all_reduce_adjoint" and options.get("cotangent") == "replicated"
    recording = _View.of(c, c.check if content_check else True, log)
    request = fn(x, recording, out=out, async_op=True, **options)
    assert isinstance(request, Request)
    finish = request._finish  # None when the run completed without communication (one rank, no traffic)
    mine = _replayable(log, x, finish, c.rank)
    calls = [(t.name, primitive) for t, primitive, _ in log.calls]
    # The ranks agree on the recorded calls and on replaying them (every rank does the same).
    verdicts = c.agree(f"hpccoll.plan({name})", {"calls": calls}, mine)
    if all(verdicts) and finish is not None:
        made = _replay(c, name, log, finish, method)
    else:
        made = _calling(c, name, fn, x, out, finish, options)
    if c.check:
        made._guard(functools.partial(_unchanged, c, name, x, _placed(x)))
    return made


def _placed(x: Any) -> Any:
    """Where ``x``'s memory lies and how it is laid out: (address, shape, strides, dtype), per array of a list."""
    if isinstance(x, (list, tuple)):
        return tuple(_placed(a) for a in x)
    try:
        # CuPy's .data.ptr: reading its __cuda_array_interface__ (even by hasattr) may synchronise the device
        address = x.__array_interface__["data"][0] if hasattr(x, "__array_interface__") else int(x.data.ptr)
    except (AttributeError, TypeError, KeyError):
        return None
    return (address, x.shape, x.strides, str(x.dtype))


def _unchanged(c: Communicator, name: str, x: Any, placed: Any, freed: bool) -> None:
    """Check mode, before each call of a plan: its buffers where and as they were when it was made, and the
    plan not freed, on every rank (one agreement: any rank's failure raises on every rank)."""
    err: Optional[HpccollError] = None
    if freed:
        err = _freed_error(name)
    else:
        now = _placed(x)
        if now != placed:
            err = HpccollError(
                f"plan of {name}: x changed since the plan was made (address, shape, strides, dtype "
                f"{placed} then, {now} now: reshaped, resized or reallocated); expected the buffer the plan "
                "was made with (make a new plan)"
            )
    c.agree(f"plan of {name}", None, None, err)


class _Log:
    """What a recording run did: the started calls, and whether anything else touched a transport."""

    __slots__ = ("calls", "impure")

    def __init__(self) -> None:
        self.calls: List[Tuple[Any, str, tuple]] = []
        self.impure = False


class _Recorder:
    """A transport whose non-blocking primitives are recorded, not started; anything else marks the run impure."""

    __slots__ = ("_t", "_log")

    def __init__(self, t: Any, log: _Log) -> None:
        self._t = t
        self._log = log

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._t, name)
        if name in _STARTS:
            return functools.partial(self._record, name[1:])
        if name == "bind_finish":
            return _unbound  # a plan binds the step when it starts
        if callable(value):
            self._log.impure = True  # a blocking primitive, a shared result: done now, not replayable
        return value

    def _record(self, primitive: str, *args: Any) -> Pending:
        self._log.calls.append((self._t, primitive, args))
        return DONE


def _unbound(finish: Callable[[], Any]) -> Callable[[], Any]:
    return finish


class _View(Communicator):
    """A communicator like ``real`` (the same MPI duplicate, transports and state) with its own check mode,
    whose transports record (``log``) or are the real ones (``log`` None)."""

    __slots__ = ("_real", "_log")
    _real: Communicator
    _log: Optional[_Log]

    @classmethod
    def of(cls, real: Communicator, check: bool, log: Optional[_Log]) -> "_View":
        view = cls.__new__(cls)
        for slot in Communicator.__slots__:
            setattr(view, slot, getattr(real, slot))
        view._owned = False  # never freed through the view
        view.check = check
        view._real = real
        view._log = log
        return view

    def _wrap(self, t: Any) -> Any:
        return t if self._log is None else _Recorder(t, self._log)

    def transport_of(self, kind: str, nbytes: int = 0, primitive: Optional[str] = None, blocking: bool = True) -> Any:
        # recorded calls are prepared (blocking or persistent), never run in their non-blocking form: they go
        # where the blocking call would
        return self._wrap(self._real.transport_of(kind, nbytes, primitive, blocking or self._log is not None))

    def transport_instance(self, name: str) -> Any:
        return self._wrap(self._real.transport_instance(name))

    def host_transport(self) -> Any:
        return self._wrap(self._real.host_transport())

    def shared_transport(self) -> Any:
        return self._wrap(self._real.shared_transport())

    def transport_for(self, array: Any) -> Any:
        return self._real.transport_for(array)

    def free(self) -> None:
        raise HpccollError("a plan's view of a communicator is not freed; free the communicator itself")


def _replayable(log: _Log, x: Any, finish: Optional[Callable[[], Any]], rank: int) -> bool:
    """Whether replaying the recorded calls, then ``finish``, is the collective on ``x``'s current contents."""
    if log.impure or not log.calls or finish is None or isinstance(x, (list, tuple)):
        return False
    sources = [x, *getattr(finish, "fills", ())]  # x, and what the collective's refill step rewrites from x
    return all(
        buf is None or getattr(buf, "nbytes", 1) == 0 or any(_within(buf, a) for a in sources)  # 0 B: read nothing
        for _, primitive, args in log.calls
        for buf in sent(primitive, args, rank)  # the buffers whose contents the call sends
    )


def _within(buf: Any, x: Any) -> bool:
    """Whether ``buf`` is memory of ``x`` (a view of it, not a copy)."""
    if isinstance(buf, np.ndarray) and isinstance(x, np.ndarray):
        return bool(np.shares_memory(buf, x))
    try:
        low, size = _span(buf)
        start, extent = _span(x)
    except (AttributeError, TypeError):
        return False
    return start <= low and low + size <= start + extent


def _span(a: Any) -> Tuple[int, int]:
    """(first byte's address, bytes) of a contiguous device array (CuPy's ``.data.ptr``: reading its
    ``__cuda_array_interface__`` would ask for a synchronisation no plan needs)."""
    return int(a.data.ptr), int(a.nbytes)


# --------------------------------------------------------------------------- replaying the recorded calls


def _replay(c: Communicator, name: str, log: _Log, finish: Callable[[], Any], method: str) -> Plan:
    prepared = []
    for t, primitive, args in log.calls:
        how = c.selector.form(t, primitive, args) if method == "auto" else method
        prepared.append(t.prepare(primitive, args, how))
    transport = log.calls[0][0]
    runs = [p.run for p in prepared]
    refill = getattr(finish, "refill", None)  # the collective's steps before its messages (halo: packing)
    if refill is not None:
        runs.insert(0, refill)
    if len(runs) == 1:
        run = runs[0]

        def call() -> Any:
            run()
            return finish()

    else:

        def call() -> Any:
            for r in runs:
                r()
            return finish()

    def begin() -> Any:
        if refill is not None:
            refill()
        return [p.start() for p in prepared], transport.bind_finish(finish)

    def end(started: Any) -> Any:
        pendings, bound = started
        for p in pendings:
            p.wait()
        return bound()

    def free() -> None:
        for p in prepared:
            p.free()

    methods = tuple(p.method for p in prepared)
    if isinstance(finish, Ready) and len(prepared) == 1 and len(prepared[0].steps) <= 2:
        return Plan(name, finish.out, methods, call, begin, end, free, prepared[0].steps)
    result = getattr(finish, "result", None)  # a refilling step's (running it now could write x: the adjoint)
    if result is None:
        with np.errstate(all="ignore"):  # what the recorded run left in its buffers is no data yet
            result = finish()  # the result object (its contents are the first call's)
    return Plan(name, result, methods, call, begin, end, free)


# --------------------------------------------------------------------------- calling the collective


def _calling(
    c: Communicator,
    name: str,
    fn: Callable[..., Any],
    x: Any,
    out: Any,
    finish: Optional[Callable[[], Any]],
    options: dict,
) -> Plan:
    """A plan that calls the collective each time, without check mode's exchange, into one ``out``."""
    quiet = _View.of(c, False, None) if c.check else c
    if out is None and finish is not None and _reusable(name, options):
        with np.errstate(all="ignore"):  # what the recorded run left in its buffers is no data yet
            out = finish()  # the run's own allocation (no user buffer): the result of every call
    state = {"out": out}

    def kept(result: Any) -> Any:
        """``result``, kept as every later call's ``out`` when no ``out`` was fixed and it can be one."""
        if state["out"] is None and _reusable(name, options) and _writable(result):
            state["out"] = result
        return result

    def call() -> Any:
        return kept(fn(x, quiet, out=state["out"], **options))

    def begin() -> Any:
        return fn(x, quiet, out=state["out"], async_op=True, **options)

    def end(request: Any) -> Any:
        return kept(request.wait())

    return Plan(name, out, ("call",), call, begin, end, lambda: None)


def _reusable(name: str, options: dict) -> bool:
    """Whether the collective's result can be its next call's ``out`` (not ``axis=None``'s per-rank list)."""
    return not (name == "all_gather" and "axis" in options and options["axis"] is None)


def _writable(result: Any) -> bool:
    arrays = result if isinstance(result, list) else [result]
    return all(getattr(getattr(a, "flags", None), "writeable", False) for a in arrays)
