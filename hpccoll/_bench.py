"""``mpiexec -n N python -m hpccoll bench``: an nccl-tests style bandwidth table.

Definitions follow nccl-tests (``doc/PERFORMANCE.md`` there): ``size`` S is the
full buffer in bytes (the gathered output of all-gather and gather, the input of
reduce-scatter, root's input of scatter, the array of all-reduce, broadcast,
reduce and the point-to-point pairs, one rank's send buffer of all-to-all),
``algbw = S / t`` with 1 GB = 1e9 B, ``busbw = algbw * 2(n-1)/n`` for
all-reduce, ``algbw`` for broadcast, reduce and the point-to-point pairs
(``shift``...: nccl-tests' sendrecv), and ``algbw * (n-1)/n`` for all-gather, reduce-scatter,
all-to-all, gather and scatter, and ``#wrong`` the number of wrong elements
found by checking the result on every rank (root's alone for reduce and
gather, as nccl-tests). The rooted collectives (broadcast, reduce, gather,
scatter) use ``-r ROOT``; the others' rows show root -1. ``time`` is
microseconds per call on the slowest rank, the median over ``--rounds``
interleaved rounds (``hpccoll._timing``).
``--baseline`` times raw mpi4py buffer calls moving the same bytes in the same
run, interleaved, and adds their time and the ratio hpccoll / raw.

The point-to-point pairs (every registered pair that sends one message each
way, :func:`hpccoll._comm.point_to_point`) get their rows from their spec: the
call with the keywords of its ``example``, the expected values and the raw
``Sendrecv`` from its ``peers``. A pair's name on the command line is its
name without underscores, as nccl-tests names its collectives.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _timing
from ._dtypes import OPS

__all__ = ["collectives", "ROOTED", "add_arguments", "main", "parse_size", "parser", "run", "run_command"]

#: The collectives written out here, in the table's order (the point-to-point pairs follow: :func:`collectives`):
#: each one's command-line name (its name without underscores, as nccl-tests names it) and name.
_WRITTEN = {
    name.replace("_", ""): name
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "reduce", "gather", "scatter")
}
#: The collectives with a root (``-r``); the others' rows show root -1.
ROOTED = ("broadcast", "reduce", "gather", "scatter")
#: The collectives with a reduction op (the others' rows show redop none).
_REDUCING = ("reducescatter", "allreduce", "reduce")
#: The collectives whose every rank's array is the whole size S (the others split it into blocks).
_WHOLE = ("allreduce", "broadcast", "reduce")
#: nccl-tests' datatype names, and short ones, for NumPy's.
_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "int": "int32",
    "uint": "uint32",
    "bf16": "bfloat16",
}
_RTOL = {"float16": 1e-2, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12, "complex64": 1e-6, "complex128": 1e-12}

EPILOG = """\
what differs from nccl-tests:
  -c N        N checked calls per size and placement, on fresh data, outside the timed loop (as
              there); 0 skips the check and #wrong shows N/A.
  -z 0|1      default 1: hpccoll's calls are blocking by default. 0 times async_op=True followed by
              the request's wait(), one call at a time (nothing overlaps it); nccl-tests' default
              -z 0 launches every iteration on the stream and waits once.
  -r ROOT     the root of broadcast, reduce, gather and scatter (default 0, as there), checked
              0 <= ROOT < ranks; one root per run (nccl-tests' -r -1, every root in turn, is
              refused). The other collectives' rows show root -1.
  in-place    broadcast, reduce, all-gather, reduce-scatter and all-reduce have an in-place form
              (out=x, or x a block of out); gather, scatter and all-to-all have none in hpccoll (out
              may not overlap x), so their in-place cells show n/a.
  -d, -o      one dtype and one op per run (no "all"); NumPy dtype names or nccl-tests' own.
  time        the slowest rank's time per call (nccl-tests -a 3), median over --rounds
              interleaved rounds; nccl-tests' default (-a 1) averages over ranks, one round.
  collective  chosen with --collective (nccl-tests has one binary per collective); "all" runs
              every one. Sizes step by -f only (no -i); one GPU per rank, chosen by the node-local
              rank (no -t, -g); no -m, -a, -p, -G, -C, -R, -T; --json instead of a CSV file.
  only here   --rounds, --device, --list, --axis, --uneven, --transport, --baseline, --json, --plot.
"""


def _point_to_point() -> Dict[str, str]:
    """The point-to-point pairs with an example call: each one's command-line name (its name without
    underscores) and name."""
    from ._comm import point_to_point
    from ._spec import HOOKS

    return {name.replace("_", ""): name for name in point_to_point() if HOOKS[name].example is not None}


def collectives() -> Tuple[str, ...]:
    """Every collective ``bench`` measures, in the table's order: those written out here, then the point-to-point
    pairs registered when asked (``shift``...).

    Returns
    -------
    tuple of str
        The ``--collective`` names.
    """
    return tuple(_WRITTEN) + tuple(_point_to_point())


def _bus(coll: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``coll`` on ``n`` ranks: ``2(n-1)/n`` for all-reduce, 1 for broadcast,
    reduce and a point-to-point pair (its sendrecv's), ``(n-1)/n`` for the others."""
    if coll == "allreduce":
        return 2 * (n - 1) / n
    return 1.0 if coll in _WHOLE or coll not in _WRITTEN else (n - 1) / n


def parse_size(text: str) -> int:
    """Bytes with an optional K, M or G suffix (powers of 1024), as nccl-tests reads ``-b`` and ``-e``.

    Parameters
    ----------
    text : str
        For example ``"8"``, ``"512K"``, ``"64M"``, ``"1G"`` (a trailing ``B`` is allowed).

    Returns
    -------
    int
        The number of bytes.

    Raises
    ------
    argparse.ArgumentTypeError
        ``text`` is not a size.

    Examples
    --------
    >>> parse_size("64M")
    67108864
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t[-1:] in units else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected a size such as 8, 512K, 64M or 1G; got {text!r}") from None


def _dtype(name: str) -> np.dtype:
    import hpccoll

    name = _ALIASES.get(name, name)
    if name not in hpccoll.SUPPORTED_DTYPES:
        raise argparse.ArgumentTypeError(f"expected a dtype among {', '.join(hpccoll.SUPPORTED_DTYPES)}; got {name!r}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _flag(text: str) -> int:
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected 0 or 1; got {text!r}")
    return int(text)


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least:
            raise argparse.ArgumentTypeError(f"expected an int >= {least}; got {text!r}")
        return n

    return parse


def _values(count: int, rank: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s deterministic data: small integers, exact in every dtype."""
    i = np.arange(count)
    if dtype == np.bool_:
        return (i + rank) % 3 == 0
    if op == "prod":
        v = 1 + ((i + rank) % 5 == 0)
    else:
        v = (i * 7 + rank * 3) % 13 + (0 if op in ("max", "min") else 1)
    return v.astype(dtype)


def _reduce(parts: List[np.ndarray], op: str, dtype: np.dtype) -> np.ndarray:
    wide = np.complex128 if dtype.kind == "c" else (np.float64 if dtype.kind in "fV" else None)
    acc = parts[0].astype(wide) if wide is not None else parts[0].copy()
    for p in parts[1:]:
        p = p.astype(wide) if wide is not None else p
        if op in ("sum", "avg"):
            acc = acc + p if dtype != np.bool_ else acc | p
        elif op == "prod":
            acc = acc * p if dtype != np.bool_ else acc & p
        elif op == "max":
            acc = np.maximum(acc, p)
        else:
            acc = np.minimum(acc, p)
    if op == "avg":
        acc = acc / len(parts)
    return acc.astype(dtype)


def _wrong(got: np.ndarray, want: np.ndarray) -> int:
    if got.dtype.name in _RTOL:
        wide = np.complex128 if got.dtype.kind == "c" else np.float64
        g, w = got.astype(wide), want.astype(wide)
        return int(np.count_nonzero(~(np.abs(g - w) <= _RTOL[got.dtype.name] * np.abs(w))))
    return int(np.count_nonzero(got != want))


def _poison(want: np.ndarray) -> np.ndarray:
    """An array of ``want``'s shape and dtype that differs from it in every element (its bits inverted)."""
    if want.dtype == np.bool_:
        return ~want
    w = np.ascontiguousarray(want)
    return (~w.view(np.uint8)).view(w.dtype).reshape(w.shape)


def _finish(fn: Callable[..., Any], blocking: bool) -> Callable[..., Any]:
    """``fn`` itself (``-z 1``), or ``fn(..., async_op=True).wait()`` (``-z 0``)."""
    if blocking:
        return fn
    return lambda *a, **kw: fn(*a, async_op=True, **kw).wait()


class _Array:
    """One array of a call, on the host: this rank's input, the expected result, this rank's block."""

    def __init__(self, x: np.ndarray, want: np.ndarray, own: Any) -> None:
        self.x, self.want, self.own = x, want, own


class Case:
    """Buffers, calls and the expected results of one collective at one size.

    Parameters
    ----------
    coll : str
        One of :func:`collectives`.
    nbytes : int
        The size S asked for (rounded down to whole blocks, at least one element per rank and array).
    args : argparse.Namespace
        The ``bench`` options (dtype, op, root, axis, uneven, list, blocking, baseline).
    comm : hpccoll.Communicator
        The ranks.
    xp : module
        ``numpy``, or ``cupy`` for device buffers.
    """

    def __init__(self, coll: str, nbytes: int, args: argparse.Namespace, comm: Any, xp: Any) -> None:
        dtype, op, axis, root = args.datatype, args.op, args.axis, args.root
        self.coll, self.dtype, self.op, self.comm, self.xp = coll, dtype, op, comm, xp
        P, r = comm.size, comm.rank
        self.root = root if coll in ROOTED else -1
        #: a point-to-point pair's name, the keywords of its spec's example call, and (to, source) on this rank
        self.pair: Optional[str] = _point_to_point().get(coll)
        self.keywords: Dict[str, Any] = {}
        self.peers: Tuple[Optional[int], Optional[int]] = (None, None)
        if self.pair is not None:
            from ._spec import HOOKS

            hooks = HOOKS[self.pair]
            assert hooks.example is not None and hooks.peers is not None, "_point_to_point's pairs name both"
            self.keywords = hooks.configure(comm, hooks.example(P))
            self.peers = hooks.peers(r, P, self.keywords)
        #: whether this rank's result is checked: every rank's, except root's alone for reduce and gather
        self.checked = coll not in ("reduce", "gather") or r == root
        n = max(args.list, 1)
        lead = 8 if axis == 1 else 1
        if coll in _WHOLE or self.pair is not None:
            units, per = 0, max(nbytes // dtype.itemsize // n, 1)
        else:
            units = max(nbytes // dtype.itemsize // lead // P // n, 1) * P
            per = units * lead
        self.count = per * n
        self.nbytes = self.count * dtype.itemsize
        weights = list(range(1, P + 1)) if args.uneven else [1] * P
        sizes = [units * w // sum(weights) for w in weights]
        sizes[-1] += units - sum(sizes)
        self.sizes = sizes

        def shape(k: int) -> tuple:
            return (lead, k) if axis == 1 else (k,)

        def block(q: int) -> tuple:
            start = sum(sizes[:q])
            return (slice(None),) * axis + (slice(start, start + sizes[q]),)

        self.arrays = [self._host(coll, i, P, r, axis, lead, shape, block, units, per) for i in range(n)]
        self.on_device: Callable[[Any], Any] = (lambda a: a) if xp is np else xp.asarray  # host arrays to the buffers
        xs = [self.on_device(a.x) for a in self.arrays]
        self.outs = [xp.empty(a.want.shape, dtype) for a in self.arrays]
        self.in_place: Optional[Callable[[], Any]] = None
        self.reset: Callable[[], Any] = lambda: None
        self.got_in_place: Callable[[], List[Any]] = lambda: []
        self._calls(_Inputs(xs, block, self.on_device, args.list > 0, bool(args.blocking), axis, r))
        self.raw: Optional[Callable[[], Any]] = None  # raw MPI on host buffers, only when asked for
        if args.baseline and xp is np:
            counts = [n * lead * s for s in sizes]
            self.raw = _raw(coll, comm.mpi, dtype, op, counts, n * per, bool(args.blocking), self.root, self.peers)

    @property
    def _hpccoll(self) -> Any:
        import hpccoll  # the public functions (imported when a case is built: the CLI loads this module first)

        return hpccoll

    def _calls(self, k: "_Inputs") -> None:
        """The calls: ``hpc`` out of place, and where the collective has one the in-place form, with ``reset`` (its
        buffers set as before a first call) and ``got_in_place`` (the arrays it wrote)."""
        coll, sizes, xp = self.coll, self.sizes, self.xp
        f = _finish(getattr(self._hpccoll, self.pair or _WRITTEN[coll]), k.blocking)
        options = dict(self.keywords)  # a point-to-point pair's: those of its spec's example
        if coll in _REDUCING:
            options["op"] = self.op
        if coll in ROOTED:
            options["root"] = self.root
        if coll == "alltoall":
            recv = [sizes[k.rank]] * self.comm.size
            options.update(split_axis=k.axis, concat_axis=k.axis, sizes=sizes, recv_sizes=recv)
        elif coll not in _WHOLE and self.pair is None:  # a list of gather or scatter takes one sizes per array
            options.update(axis=k.axis, sizes=[sizes] * len(self.arrays) if k.many and coll in ROOTED else sizes)
        X, OUT = k.of(self.outs)
        self.hpc = lambda: f(X, self.comm, out=OUT, **options)
        if coll in _WHOLE or self.pair is not None:  # in place, out=x, on copies of ``fill`` restored by reset
            # broadcast: root's x is its input; the others' hold every element wrong, so one left unwritten is
            # counted; the others: every rank's its own input
            fill = k.xs
            if coll == "broadcast" and k.rank != self.root:
                fill = [k.on_device(_poison(a.want)) for a in self.arrays]
            scratches = [x.copy() for x in fill]
            S = scratches if k.many else scratches[0]
            self.in_place = lambda: f(S, self.comm, out=S, **options)
            self.reset = lambda: [xp.copyto(s, x) for s, x in zip(scratches, fill)]
            self.got_in_place = lambda: scratches
        elif coll == "allgather" and not k.many:  # x this rank's block of out (the list form has no such layout)
            own, whole = k.block(k.rank), self.outs[0]
            mine = whole[own]
            self.in_place = lambda: f(mine, self.comm, out=whole, **options)

            def reset() -> None:  # a result with nothing of a previous call's in it, this rank's block set
                xp.copyto(whole, k.on_device(_poison(self.arrays[0].want)))
                whole[own] = k.xs[0]

            self.reset = reset
            self.got_in_place = lambda: [whole]
        elif coll == "reducescatter" and not k.many:  # out this rank's block of x
            scratch = k.xs[0].copy()
            part = scratch[k.block(k.rank)]
            self.in_place = lambda: f(scratch, self.comm, out=part, **options)
            self.reset = lambda: xp.copyto(scratch, k.xs[0])
            self.got_in_place = lambda: [part]
        # all-to-all, gather and scatter have no in-place form (out may not overlap x)

    def _host(
        self, coll: str, i: int, P: int, r: int, axis: int, lead: int, shape: Any, block: Any, units: int, per: int
    ) -> _Array:
        """Array ``i`` of the call: rank ``q``'s data is ``_values(..., q + 3 i)``, so every array differs.

        The expected results depend on the root: a call that ignores ``-r`` is counted wrong.
        """
        dtype, op, sizes, root = self.dtype, self.op, self.sizes, self.root
        if coll in ("allgather", "gather"):
            blocks = [_values(lead * s, q + 3 * i, dtype, op).reshape(shape(s)) for q, s in enumerate(sizes)]
            whole = np.concatenate(blocks, axis=axis)
            if coll == "allgather":
                return _Array(blocks[r], whole, block(r))
            # gather: root gets the concatenation, the others an empty array of x's other extents
            return _Array(blocks[r], whole if r == root else np.empty(shape(0), dtype), None)
        if coll in _WHOLE or self.pair is not None:
            parts = [_values(per, q + 3 * i, dtype, op) for q in range(P)]
            if self.pair is not None:  # a point-to-point pair: its source's, zeros where it has none
                source = self.peers[1]
                return _Array(parts[r], np.zeros_like(parts[r]) if source is None else parts[source].copy(), None)
            if coll == "broadcast":  # every rank gets root's (the others' inputs differ from it)
                return _Array(parts[r], parts[root].copy(), None)
            return _Array(parts[r], _reduce(parts, op, dtype), None)  # reduce: only root's result is checked
        full = [_values(per, q + 3 * i, dtype, op).reshape(shape(units)) for q in range(P)]
        if coll == "scatter":  # root's array split; the others pass an empty one (its extent along axis is free)
            return _Array(full[r] if r == root else np.empty(shape(0), dtype), full[root][block(r)], None)
        if coll == "reducescatter":
            return _Array(full[r], _reduce(full, op, dtype)[block(r)], block(r))
        # all-to-all: block r of every rank's x, in rank order
        return _Array(full[r], np.concatenate([f[block(r)] for f in full], axis=axis), None)

    def wrong(self, in_place: bool) -> int:
        """Run once on fresh data and count this rank's wrong elements (over every array of the call).

        Outputs first hold every element wrong (:func:`_poison`), so a call that leaves one
        untouched is counted; in-place inputs are restored. Every rank makes the call; a rank
        whose result is not checked (reduce and gather away from root) counts 0.
        """
        if in_place and self.in_place is not None:
            self.reset()
            self.in_place()
            got = self.got_in_place()
        else:
            for o, a in zip(self.outs, self.arrays):
                self.xp.copyto(o, self.on_device(_poison(a.want)))
            self.hpc()
            got = self.outs
        host = (lambda a: a) if self.xp is np else self.xp.asnumpy
        results = [host(g) for g in got]  # on every rank: the call has finished (a device stream synchronised)
        if not self.checked:
            return 0
        return sum(_wrong(g, a.want) for g, a in zip(results, self.arrays))


def _raw(
    coll: str,
    mpi: Any,
    dtype: np.dtype,
    op: str,
    counts: List[int],
    total: int,
    blocking: bool,
    root: int = -1,
    peers: Tuple[Optional[int], Optional[int]] = (None, None),
) -> Optional[Callable[[], Any]]:
    """The raw mpi4py call moving the same bytes as the case (its I-form and Wait for ``-z 0``), on flat buffers.

    ``counts`` are the elements of each rank's block (all-gather, reduce-scatter, gather,
    scatter) or sent to each rank (all-to-all); ``total`` the elements of one rank's array of
    all-reduce, broadcast, reduce and the point-to-point pairs; ``root`` the root of the rooted
    ones (buffers that MPI reads only at root are None elsewhere); ``peers`` a point-to-point
    pair's ``(to, source)`` on this rank (``None``: no message that way).
    """
    from mpi4py import MPI

    from ._dtypes import movement_dtype
    from .transports._mpitypes import displacements, mpi_datatype, mpi_op

    call = _caller(mpi, blocking)
    even = counts.count(counts[0]) == len(counts)
    r, P, at_root = mpi.rank, mpi.size, mpi.rank == root
    if coll in _REDUCING:  # the reductions, on buffers of dtype
        if op == "avg" or dtype.kind in "bV" or dtype.itemsize == 2 and dtype.kind == "f":
            return None  # only hpccoll can run avg, 16-bit floats and bool
        t, o = mpi_datatype(dtype), mpi_op(op)
        if coll == "reducescatter":
            send, recv = np.zeros(sum(counts), dtype), np.zeros(counts[r], dtype)
            if even:
                return call("Reduce_scatter_block", [send, t], [recv, t], o)
            return call("Reduce_scatter", [send, t], [recv, t], counts, o)
        x, out = np.zeros(total, dtype), np.zeros(total, dtype)
        if coll == "reduce":
            return call("Reduce", [x, t], [out, t] if at_root else None, o, root)
        return call("Allreduce", [x, t], [out, t], o)
    # the data-movement collectives, on buffers of the dtype that moves dtype's bytes
    wire = movement_dtype(dtype)
    t = mpi_datatype(wire)
    if coll not in _WRITTEN:  # a point-to-point pair, to and from its peers (MPI.PROC_NULL: none)
        sbuf, rbuf = [np.zeros(total, wire), t], [np.zeros(total, wire), t]
        to, source = (MPI.PROC_NULL if q is None else q for q in peers)
        if blocking:
            return lambda: mpi.Sendrecv(sbuf, to, 0, rbuf, source, 0)
        return lambda: [q.Wait() for q in (mpi.Irecv(rbuf, source, 0), mpi.Isend(sbuf, to, 0))]
    if coll == "broadcast":
        return call("Bcast", [np.zeros(total, wire), t], root)
    v = "" if even else "v"  # uneven: the v-form, each buffer of many blocks with its counts and displacements

    def many(buf: Optional[np.ndarray], c: List[int]) -> Optional[list]:
        return None if buf is None else [buf, t] if even else [buf, (c, displacements(c)), t]

    whole = np.zeros(sum(counts), wire) if at_root or coll not in ROOTED else None
    mine = np.zeros(counts[r], wire)
    if coll == "gather":
        return call("Gather" + v, [mine, t], many(whole, counts), root)
    if coll == "scatter":
        return call("Scatter" + v, many(whole, counts), [mine, t], root)
    if coll == "allgather":
        return call("Allgather" + v, [mine, t], many(whole, counts))
    back = [counts[r]] * P
    return call("Alltoall" + v, many(whole, counts), many(np.zeros(P * counts[r], wire), back))


def _caller(mpi: Any, blocking: bool) -> Callable[..., Callable[[], Any]]:
    """``call(name, *args)``: a callable making mpi4py's ``name(*args)``, or its I-form and ``Wait``."""

    def call(name: str, *a: Any) -> Callable[[], Any]:
        if blocking:
            fn = getattr(mpi, name)
            return lambda: fn(*a)
        ifn = getattr(mpi, "I" + name[0].lower() + name[1:])
        return lambda: ifn(*a).Wait()

    return call


def _device(name: str) -> tuple:
    """``(xp, sync)`` for ``--device``: NumPy and no sync, or CuPy and its current stream's synchronize."""
    if name == "numpy":
        return np, None
    from .transports._cuda import get_runtime

    rt = get_runtime()
    return rt.xp, rt.sync_stream


def _cells(t: Optional[float], nbytes: int, factor: float, wrong: Optional[int]) -> tuple:
    """One placement's text cells and JSON entry (``t`` None: no such form)."""
    if t is None:
        return f" {'n/a':>8} {'n/a':>7} {'n/a':>7} {'n/a':>6}", None
    algbw = nbytes / 1e9 / t
    busbw = algbw * factor
    shown = "N/A" if wrong is None else str(wrong)
    return (
        f" {t * 1e6:>8.1f} {algbw:>7.2f} {busbw:>7.2f} {shown:>6}",
        {"time_us": t * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong},
    )


class _Inputs(NamedTuple):
    """What a collective's calls are built from (:meth:`Case._calls`)."""

    xs: List[Any]  # the inputs, on the device where the buffers are
    block: Callable[[int], tuple]  # rank q's block of a whole array (an index)
    on_device: Callable[[Any], Any]  # a host array moved where the buffers are
    many: bool  # the list form
    blocking: bool  # blocking calls (else async_op=True, then wait)
    axis: int
    rank: int

    def of(self, outs: List[Any]) -> Tuple[Any, Any]:
        """The call's input and out: the lists, or their one array."""
        return (self.xs, outs) if self.many else (self.xs[0], outs[0])


def run(args: argparse.Namespace, comm: Any, say: Callable[[str], None]) -> List[Dict[str, Any]]:
    """Measure every size of every requested collective; print rows as they are measured.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed ``bench`` options (:func:`add_arguments`).
    comm : hpccoll.Communicator
        The ranks.
    say : callable
        Prints one line (rank 0) or nothing (the others).

    Returns
    -------
    list of dict
        One entry per row: ``collective``, ``size``, ``count``, ``type``, ``redop``, ``root`` (``-r``
        for the rooted collectives, -1 for the others),
        ``oop`` and ``ip`` (``time_us``, ``algbw``, ``busbw``, ``wrong``; ``ip`` is None for a
        form with no in-place layout, ``wrong`` None under ``-c 0``), and with ``--baseline``
        ``baseline_us`` and ``ratio`` where raw MPI has the call.
    """
    xp, sync = _device(args.device)
    colls = collectives() if args.collective == "all" else (args.collective,)
    rows: List[Dict[str, Any]] = []
    for coll in colls:
        _say_header(coll, args, comm, say)
        size = args.minbytes
        while size <= args.maxbytes:
            row, text = _measured_row(Case(coll, size, args, comm, xp), args, comm, sync)
            say(text)
            rows.append(row)
            size *= args.stepfactor
    if args.check:
        bad = _wrong_total(rows)
        say(f"# Out of bounds values : {bad} {'OK' if bad == 0 else 'FAILED'}")
    else:
        say("# Out of bounds values : N/A (not checked: -c 0)")
    avg = statistics.mean(r["oop"]["busbw"] for r in rows) if rows else 0.0
    say(f"# Avg bus bandwidth    : {avg:.4g}")
    say("#")
    return rows


def _say_header(coll: str, args: argparse.Namespace, comm: Any, say: Callable[[str], None]) -> None:
    """Print one collective's header: the call measured, then nccl-tests' column titles and units."""
    op = args.op if coll in _REDUCING else "none"
    form = f", lists of {args.list} arrays" if args.list else ""
    at = f", root {args.root}" if coll in ROOTED else ""
    say(
        f"#\n# {coll}: {comm.size} ranks{at}, dtype {args.datatype.name}, op {op}, axis {args.axis}, "
        f"{'uneven' if args.uneven else 'even'} shards, {args.device} buffers{form}, transport {comm.transport}"
    )
    head = f"#{'size':>11}{'count':>13}{'type':>10}{'redop':>8}{'root':>6}" + "".join(
        f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}" for _ in range(2)
    )
    if args.baseline:
        head += f"{'base':>9}{'ratio':>7}"
    say("#" + " " * 48 + "out-of-place".center(32) + "in-place".center(32))
    say(head)
    say(
        f"#{'(B)':>11}{'(elements)':>13}{'':>24}"
        + f"{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>7}" * 2
        + (f"{'(us)':>9}" if args.baseline else "")
    )


def _measured_row(case: Case, args: argparse.Namespace, comm: Any, sync: Any) -> Tuple[Dict[str, Any], str]:
    """Time one size's forms side by side, count their wrong elements; the row and its printed line."""
    from mpi4py import MPI

    coll = case.coll
    op = args.op if coll in _REDUCING else "none"
    fns: Dict[str, Callable[[], Any]] = {"oop": case.hpc}
    if case.in_place is not None:
        fns["ip"] = case.in_place
    if case.raw is not None:
        fns["raw"] = case.raw
    iters = args.iters if case.nbytes < (1 << 24) else max(1, args.iters // 4)
    samples = _timing.interleave(comm, fns, iters=iters, rounds=args.rounds, warmup=args.warmup, sync=sync)
    times = _timing.medians(samples)
    wrong: Dict[str, Optional[int]] = {}
    for key in [k for k in ("oop", "ip") if k in fns]:  # the same order on every rank
        mine = sum(case.wrong(key == "ip") for _ in range(args.check))
        wrong[key] = comm.mpi.allreduce(mine, op=MPI.SUM) if args.check else None
    row: Dict[str, Any] = {
        "collective": coll,
        "size": case.nbytes,
        "count": case.count,
        "type": args.datatype.name,
        "redop": op,
        "root": case.root,
    }
    # every field starts with a space, so a wide value never runs into its neighbour
    text = f" {case.nbytes:>11} {case.count:>12} {args.datatype.name:>9} {op:>7} {case.root:>5}"
    for key in ("oop", "ip"):
        cells, row[key] = _cells(times.get(key), case.nbytes, _bus(coll, comm.size), wrong.get(key))
        text += cells
    if args.baseline:
        if "raw" in times:
            row["baseline_us"] = times["raw"] * 1e6
            row["ratio"] = _timing.paired_ratio(samples, "oop", "raw")
            text += f" {times['raw'] * 1e6:>8.1f} {row['ratio']:>6.3f}"
        else:  # no raw MPI equivalent (avg, 16-bit floats, bool), or device buffers
            text += f" {'n/a':>8} {'-':>6}"
    return row, text


def _wrong_total(rows: Sequence[Dict[str, Any]]) -> int:
    return sum(r[k]["wrong"] or 0 for r in rows for k in ("oop", "ip") if r[k] is not None)


def _plot(rows: List[Dict[str, Any]], path: str, ranks: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for coll in collectives():
        mine = [r for r in rows if r["collective"] == coll]
        if not mine:
            continue
        sizes = [r["size"] for r in mine]
        ax.plot(sizes, [r["oop"]["busbw"] for r in mine], marker="o", label=f"{coll} (hpccoll)")
        base = [
            (r["size"], r["size"] / 1e9 / (r["baseline_us"] / 1e6) * _bus(coll, ranks))
            for r in mine
            if "baseline_us" in r
        ]
        if base:
            ax.plot(*zip(*base), linestyle="--", marker="x", label=f"{coll} (raw mpi4py)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size S (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"hpccoll bench, {ranks} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``p``: nccl-tests' letters where the two overlap, long options for the rest.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The parser (``python -m hpccoll bench``'s, or a subcommand's).
    """
    # the options nccl-tests has too, with its letters and meanings
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"), help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"), help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="size multiplier between rows (default 2)")
    p.add_argument("-n", "--iters", type=_count(1), default=20, help="timed iterations per round (default 20)")
    p.add_argument(
        "-w", "--warmup_iters", "--warmup", dest="warmup", type=_count(0), default=5, help="warm-up calls (default 5)"
    )
    p.add_argument(
        "-c",
        "--check",
        type=_count(0),
        default=1,
        metavar="N",
        help="check N calls per size and placement against the expected values; 0 skips (default 1)",
    )
    p.add_argument(
        "-d",
        "--datatype",
        type=_dtype,
        default=np.dtype(np.float32),
        help="float32 (default), float64, float16, bfloat16, int32, ... (nccl-tests names work too)",
    )
    p.add_argument("-o", "--op", choices=OPS, default="sum", help="default sum")
    p.add_argument(
        "-r",
        "--root",
        type=int,
        default=0,
        help="root rank of broadcast, reduce, gather and scatter, in [0, ranks) (default 0)",
    )
    p.add_argument(
        "-z",
        "--blocking",
        type=_flag,
        default=1,
        metavar="0|1",
        help="1: blocking calls (default); 0: async_op=True, then wait()",
    )
    # the options nccl-tests does not have: which calls, on which arrays, and what is written
    p.add_argument("--collective", choices=collectives() + ("all",), default="all", help="default all")
    p.add_argument("--rounds", type=_count(1), default=3, help="interleaved rounds; the median is shown (default 3)")
    p.add_argument(
        "--device",
        choices=("numpy", "cupy"),
        default="numpy",
        help="NumPy arrays (default) or CuPy arrays on the node-local rank's GPU (needs CuPy and a GPU)",
    )
    p.add_argument(
        "--list",
        type=_count(0),
        default=0,
        metavar="N",
        help="time the coalesced list form: N arrays per call, the size split among them (default 0: one array)",
    )
    p.add_argument("--transport", default="auto", help="transport name (default auto)")
    p.add_argument("--axis", type=int, choices=(0, 1), default=0, help="gather/scatter/split axis of the arrays")
    p.add_argument("--uneven", action="store_true", help="rank r holds (or gets) a share proportional to r + 1")
    p.add_argument("--baseline", action="store_true", help="also time raw mpi4py calls, interleaved (NumPy buffers)")
    p.add_argument("--json", metavar="FILE", help="write the rows to FILE (rank 0)")
    p.add_argument("--plot", metavar="FILE.png", help="plot bus bandwidth vs size (needs matplotlib)")


def parser() -> argparse.ArgumentParser:
    """The standalone ``bench`` parser (``python -m hpccoll`` builds the same options as a subcommand).

    Returns
    -------
    argparse.ArgumentParser
        With :func:`add_arguments`'s options, this module's docstring and the nccl-tests epilog.
    """
    p = argparse.ArgumentParser(
        prog="python -m hpccoll bench",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def _preflight(args: argparse.Namespace, world: Any) -> Optional[str]:
    """What would make the run fail after measuring, found before it (the same verdict on every rank)."""
    problem = None
    if args.plot and world.rank == 0:  # only rank 0 plots
        try:
            import matplotlib  # noqa: F401
        except Exception as exc:
            problem = (
                f"--plot: expected matplotlib to import (pip install 'hpccoll[plot]'); got {type(exc).__name__}: {exc}"
            )
    if args.device == "cupy" and problem is None:
        try:
            from .transports._cuda import get_runtime

            rt = get_runtime()
            count = rt.device_count()
        except Exception as exc:
            problem = f"--device cupy: expected CuPy and a GPU; got {type(exc).__name__}: {exc}"
        else:
            if count < 1:
                problem = f"--device cupy: expected a GPU; got {count} visible"
    problems = [p for p in world.allgather(problem) if p is not None]
    return problems[0] if problems else None


def run_command(args: argparse.Namespace, p: argparse.ArgumentParser, shown: Sequence[str]) -> int:
    """Run ``bench`` with parsed options; errors in them go through ``p.error`` (exit status 2).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options.
    p : argparse.ArgumentParser
        The parser they came from (for errors that need the ranks to be known).
    shown : sequence of str
        The options as typed, for the table's header.

    Returns
    -------
    int
        0, or 1 if any checked result was wrong.
    """
    from mpi4py import MPI

    import hpccoll

    if args.stepfactor < 2 or args.minbytes < 1 or args.maxbytes < args.minbytes:
        p.error(
            "expected 1 <= minbytes <= maxbytes and stepfactor >= 2; "
            f"got -b {args.minbytes} -e {args.maxbytes} -f {args.stepfactor}"
        )
    world = MPI.COMM_WORLD
    if not 0 <= args.root < world.size:
        p.error(f"argument -r/--root: expected a rank in [0, {world.size}); got {args.root}")
    problem = _preflight(args, world)
    if problem is not None:
        p.error(problem)
    if args.device == "cupy":
        from ._local import local_rank
        from .transports._cuda import get_runtime

        rt = get_runtime()
        rt.use_device(local_rank()[0] % rt.device_count())  # one GPU per rank where there are enough
    comm = hpccoll.Communicator(transport=args.transport)
    say = (lambda line: print(line, flush=True)) if comm.rank == 0 else (lambda line: None)
    say(f"# hpccoll {hpccoll.__version__} bench: mpiexec -n {comm.size} python -m hpccoll bench " + " ".join(shown))
    say(
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup} iters: {args.iters} rounds: {args.rounds} validation: {args.check} "
        f"blocking: {args.blocking} device: {args.device} arrays per call: {args.list or 1}"
        + (" (list form)" if args.list else "")
    )
    say(f"# root {args.root}: of the rooted collectives ({', '.join(ROOTED)}); the others' rows show -1")
    say("# time: the slowest rank's time per call, median over interleaved rounds")
    rows = run(args, comm, say)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as fh:
            json.dump({"ranks": comm.size, "rows": rows}, fh, indent=1)
    if comm.rank == 0 and args.plot:
        _plot(rows, args.plot, comm.size)
    comm.free()
    return 1 if _wrong_total(rows) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hpccoll bench [options]``: run the benchmark; rank 0 prints.

    Parameters
    ----------
    argv : sequence of str, optional
        The options (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0, or 1 if any checked result was wrong (bad options exit with status 2).
    """
    given = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    return run_command(p.parse_args(given), p, given)
