"""Conjugate Gradient on the 2-D Poisson problem, rows split over ranks, with planned collectives.

Launch (any number of ranks up to ``n``; 1-4 checked by tests/test_example_cg.py):

    mpiexec -n 4 python -m mpi4py examples/cg_poisson.py [--n 61] [--rtol 1e-10] [--rounds 5]

The problem. On the unit square with ``u = 0`` on the boundary, ``-Laplace(u) = f`` is
discretised on an ``n x n`` interior grid (spacing ``h = 1 / (n + 1)``) with the 5-point
stencil. Scaled by ``h^2`` it reads ``A u = b`` with ``b = h^2 f`` and::

    (A u)_ij = 4 u_ij - u_{i-1,j} - u_{i+1,j} - u_{i,j-1} - u_{i,j+1},    u = 0 outside the grid

``A`` is symmetric positive definite, so the Conjugate Gradient method solves it. The right-hand
side ``f(x, y) = (1 + x) exp(y)`` is smooth and has no symmetry, so that a block placed on the
wrong rank, or a row flipped, shows in the solution. CG stops when ``||r|| <= rtol ||b||``.

The distribution. The ``n`` grid rows are split over the ``P`` ranks as ``numpy.array_split``
splits them (uneven when ``P`` does not divide ``n``), on a 1-D Cartesian communicator
``cart = comm.cartesian((P,), periodic=False)``. Each rank stores its rows inside one ghost row
above and one below, a block of shape ``(rows + 2, n)``; the columns need no ghosts (the whole
row is local, and the zeros beyond its ends are the boundary). Before each product ``A p`` the
ghost rows of ``p`` are refreshed in place by ``hpccoll.halo_exchange(p, cart, halo=1, out=p)``
(``halo`` gives one width per *grid* axis: one ghost row on each side of axis 0; axis 1, beyond
the 1-D grid, is carried along whole); the ghosts beyond the first and last rank's edge are never
written and stay 0, the Dirichlet boundary.

Planned collectives. One CG iteration needs one halo exchange and two dot products, each a
one-element all-reduce: latency, not bandwidth, at this size. Both are *planned* once, before
the loop, and then only run::

    partial = np.empty(1)
    total = hpccoll.plan(hpccoll.all_reduce, partial, comm)          # validated once (collective)
    partial[0] = np.vdot(a, b); dot = total()[0]                      # per dot product
    exchange = hpccoll.plan(hpccoll.halo_exchange, p, cart, out=p, halo=1)
    exchange()                                                         # per iteration: p's ghost rows

The same CG loop, written with raw mpi4py blocking calls (``Allreduce`` on one-element buffers,
``Sendrecv`` of the ghost rows), is timed against it on the same problem: the two loops run
alternately for ``--rounds`` rounds, and the report gives the median time per iteration (the
slowest rank's) of each, and their ratio. The timing is information, never a check: the machine
may be shared and oversubscribed.

Checks, each printed as ``[ok]`` or ``[FAILED]`` (exit status 0 only when every one passes):

1. planned CG converges to ``rtol`` within ``--maxiter`` iterations;
2. its solution, gathered on every rank with ``hpccoll.all_gather``, matches a serial direct
   solve of the same system (the fast Poisson solver: ``A`` diagonalised by the discrete sine
   transform, in NumPy), to the bound ``||u - u*|| / ||u*|| <= cond(A) rtol`` that a relative
   residual of ``rtol`` implies;
3. every timed run of the planned loop and of the raw mpi4py loop takes the same number of
   iterations and ends at the same solution as the first planned solve.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import hpccoll


def rhs(n: int) -> np.ndarray:
    """The global right-hand side ``b = h^2 f`` on the ``n x n`` interior grid.

    Parameters
    ----------
    n : int
        Interior grid points per axis.

    Returns
    -------
    numpy.ndarray
        Shape ``(n, n)``: row ``i`` is ``x = (i + 1) h``, column ``j`` is ``y = (j + 1) h``.
    """
    h = 1.0 / (n + 1)
    x = h * np.arange(1, n + 1)
    return h * h * np.outer(1.0 + x, np.exp(x))


def apply_operator(p: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``A p`` on this rank's rows, from the ghost-padded block ``p``.

    Parameters
    ----------
    p : numpy.ndarray
        Shape ``(rows + 2, n)``: this rank's rows with one (filled) ghost row above and below.
    out : numpy.ndarray
        Shape ``(rows, n)``: where ``A p`` is written.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    c = p[1:-1]
    np.multiply(c, 4.0, out=out)
    out -= p[:-2]
    out -= p[2:]
    out[:, 1:] -= c[:, :-1]  # the left neighbour; beyond column 0 it is the boundary, 0
    out[:, :-1] -= c[:, 1:]
    return out


class PlannedComms:
    """The communication of one CG solve as hpccoll plans: ghost rows of ``p`` and one-element sums (collective).

    Parameters
    ----------
    p : numpy.ndarray
        The ghost-padded search direction, shape ``(rows + 2, n)``; its ghost rows are exchanged in place.
    cart : hpccoll.Communicator
        The 1-D Cartesian communicator the rows are split over.
    """

    def __init__(self, p: np.ndarray, cart: hpccoll.Communicator) -> None:
        self.partial = np.empty(1)
        self.total = hpccoll.plan(hpccoll.all_reduce, self.partial, cart)
        self.halo = hpccoll.plan(hpccoll.halo_exchange, p, cart, out=p, halo=1)

    def exchange(self) -> None:
        """Refresh the ghost rows of ``p`` from the neighbouring ranks."""
        self.halo()

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        """``<a, b>`` summed over ranks.

        Parameters
        ----------
        a, b : numpy.ndarray
            This rank's parts of the two vectors.

        Returns
        -------
        float
            The global inner product, the same on every rank.
        """
        self.partial[0] = np.vdot(a, b)
        return float(self.total()[0])

    def free(self) -> None:
        """Release both plans (collective)."""
        self.total.free()
        self.halo.free()


class RawComms:
    """The same communication with raw mpi4py blocking calls: ``Sendrecv`` of the ghost rows, ``Allreduce``.

    Parameters
    ----------
    p : numpy.ndarray
        The ghost-padded search direction, shape ``(rows + 2, n)``.
    comm : mpi4py.MPI.Cartcomm
        A 1-D Cartesian MPI communicator (``reorder=False``: the ranks of ``cart``).
    """

    def __init__(self, p: np.ndarray, comm: MPI.Cartcomm) -> None:
        self.p, self.comm = p, comm
        self.up, self.down = comm.Shift(0, 1)  # MPI.PROC_NULL beyond the edges: those ghosts stay 0
        self.partial, self.result = np.empty(1), np.empty(1)

    def exchange(self) -> None:
        """Refresh the ghost rows of ``p``: first row up and last ghost from below, then the reverse."""
        p = self.p
        self.comm.Sendrecv(p[1], dest=self.up, sendtag=0, recvbuf=p[-1], source=self.down, recvtag=0)
        self.comm.Sendrecv(p[-2], dest=self.down, sendtag=1, recvbuf=p[0], source=self.up, recvtag=1)

    def dot(self, a: np.ndarray, b: np.ndarray) -> float:
        """``<a, b>`` summed over ranks (see :meth:`PlannedComms.dot`)."""
        self.partial[0] = np.vdot(a, b)
        self.comm.Allreduce(self.partial, self.result, op=MPI.SUM)
        return float(self.result[0])

    def free(self) -> None:
        """Nothing to release: the communicator belongs to the caller."""


def cg(
    b: np.ndarray, p: np.ndarray, comms: PlannedComms | RawComms, rtol: float, maxiter: int
) -> Tuple[np.ndarray, int, float]:
    """Solve ``A x = b`` by Conjugate Gradient from ``x = 0`` (collective).

    Parameters
    ----------
    b : numpy.ndarray
        This rank's rows of the right-hand side, shape ``(rows, n)``.
    p : numpy.ndarray
        The search direction's ghost-padded buffer, shape ``(rows + 2, n)``, the one ``comms`` exchanges;
        its ghost rows must hold 0 (they stay 0 beyond the domain's edge).
    comms : PlannedComms or RawComms
        The ghost-row exchange of ``p`` and the global dot product.
    rtol : float
        Stop when ``||r|| <= rtol ||b||``.
    maxiter : int
        The most iterations.

    Returns
    -------
    x : numpy.ndarray
        This rank's rows of the solution.
    iterations : int
        Iterations done.
    relres : float
        The final ``||r|| / ||b||`` (of the updated residual).
    """
    x = np.zeros_like(b)
    r = b.copy()
    q = np.empty_like(b)
    pi = p[1:-1]
    pi[...] = r
    rr = bb = comms.dot(r, r)
    k = 0
    while k < maxiter and rr > rtol * rtol * bb:
        comms.exchange()
        apply_operator(p, out=q)
        alpha = rr / comms.dot(pi, q)
        x += alpha * pi
        r -= alpha * q
        rr_new = comms.dot(r, r)
        pi *= rr_new / rr
        pi += r
        rr = rr_new
        k += 1
    return x, k, float(np.sqrt(rr / bb)) if bb else 0.0


def serial_solve(b: np.ndarray) -> np.ndarray:
    """The serial reference: ``A^{-1} b`` on the whole grid by the fast Poisson solver (no CG involved).

    ``A = T (x) I + I (x) T`` with ``T = tridiag(-1, 2, -1)``, and ``T = S diag(lam) S`` with the
    orthogonal, symmetric sine matrix ``S_jk = sqrt(2 / (n + 1)) sin(j k pi / (n + 1))``, so
    ``A^{-1} B = S ((S B S) / (lam_j + lam_k)) S``.

    Parameters
    ----------
    b : numpy.ndarray
        The global right-hand side, shape ``(n, n)``.

    Returns
    -------
    numpy.ndarray
        The exact solution (up to rounding), shape ``(n, n)``.
    """
    n = b.shape[0]
    k = np.arange(1, n + 1)
    s = np.sqrt(2.0 / (n + 1)) * np.sin(np.outer(k, k) * np.pi / (n + 1))
    lam = 2.0 - 2.0 * np.cos(k * np.pi / (n + 1))
    return s @ ((s @ b @ s) / (lam[:, None] + lam[None, :])) @ s


def condition_number(n: int) -> float:
    """``cond(A)`` in the 2-norm: the ratio of its largest and smallest eigenvalues, ``lam_n / lam_1``."""
    return float((1.0 - np.cos(n * np.pi / (n + 1))) / (1.0 - np.cos(np.pi / (n + 1))))


def own_rows(n: int, cart: hpccoll.Communicator) -> slice:
    """This rank's rows of ``n``: block ``cart.coords[0]`` of ``numpy.array_split``'s split."""
    sizes = hpccoll.split_sizes(n, cart.dims[0])
    start = sum(sizes[: cart.coords[0]])
    return slice(start, start + sizes[cart.coords[0]])


def solve_distributed(
    n: int, cart: hpccoll.Communicator, rtol: float = 1e-10, maxiter: Optional[int] = None
) -> Tuple[np.ndarray, int, float]:
    """Planned CG on this rank's rows of the ``n x n`` problem, gathered on every rank (collective).

    Parameters
    ----------
    n : int
        Interior grid points per axis (at least ``cart.size``).
    cart : hpccoll.Communicator
        A 1-D Cartesian communicator (``comm.cartesian((P,), periodic=False)``).
    rtol : float
        CG's relative residual tolerance.
    maxiter : int, optional
        The most iterations (default ``n * n``, where exact arithmetic would have converged).

    Returns
    -------
    u : numpy.ndarray
        The whole solution, shape ``(n, n)``, on every rank.
    iterations : int
        CG iterations done.
    relres : float
        The final relative residual.
    """
    own = own_rows(n, cart)
    p = np.zeros((own.stop - own.start + 2, n))
    comms = PlannedComms(p, cart)
    try:
        x, k, relres = cg(rhs(n)[own], p, comms, rtol, n * n if maxiter is None else maxiter)
    finally:
        comms.free()
    return hpccoll.all_gather(x, cart, axis=0), k, relres


def time_loops(
    make: Sequence[Callable[[np.ndarray], PlannedComms | RawComms]],
    b: np.ndarray,
    rtol: float,
    maxiter: int,
    rounds: int,
    barrier: Callable[[], None],
) -> Tuple[List[List[float]], List[List[Tuple[np.ndarray, int]]]]:
    """Time the CG loop with each set of communication, alternately, ``rounds`` times (collective).

    Parameters
    ----------
    make : sequence of callable
        Each builds the communication for a padded buffer ``p`` (plans are made outside the timed loop).
    b : numpy.ndarray
        This rank's rows of the right-hand side.
    rtol, maxiter :
        As for :func:`cg`.
    rounds : int
        Timed runs of each loop; the first loop goes first in even rounds, second in odd ones.
    barrier : callable
        Lines the ranks up before each timed run.

    Returns
    -------
    seconds : list of list of float
        Per loop, the seconds per iteration of each round, on this rank.
    results : list of list of (numpy.ndarray, int)
        Per loop, each round's solution rows and iteration count.
    """
    seconds: List[List[float]] = [[] for _ in make]
    results: List[List[Tuple[np.ndarray, int]]] = [[] for _ in make]
    for rnd in range(rounds):
        order = range(len(make)) if rnd % 2 == 0 else reversed(range(len(make)))
        for which in order:
            p = np.zeros((b.shape[0] + 2, b.shape[1]))
            comms = make[which](p)
            barrier()
            t0 = time.perf_counter()
            x, k, _ = cg(b, p, comms, rtol, maxiter)
            elapsed = time.perf_counter() - t0
            comms.free()
            seconds[which].append(elapsed / max(k, 1))
            results[which].append((x, k))
    return seconds, results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=61, help="interior grid points per axis (at least the rank count)")
    parser.add_argument("--rtol", type=float, default=1e-10, help="CG stops at ||r|| <= rtol ||b||")
    parser.add_argument("--maxiter", type=int, default=None, help="most CG iterations (default n * n)")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each loop, alternating (0: no timing)")
    args = parser.parse_args(argv)
    n, rtol = args.n, args.rtol
    maxiter = n * n if args.maxiter is None else args.maxiter

    comm = hpccoll.Communicator()
    rank, size = comm.rank, comm.size
    if n < size:  # every rank needs a row: a ghost row comes from the neighbour's owned rows
        parser.error(f"--n: expected at least the {size} ranks; got {n}")
    cart = comm.cartesian((size,), periodic=False)
    raw = MPI.COMM_WORLD.Create_cart([size], periods=[False], reorder=False)
    say = print if rank == 0 else (lambda *a, **k: None)
    failures = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        ok = comm.mpi.allreduce(bool(ok), op=MPI.LAND)
        say(f"  [{'ok' if ok else 'FAILED'}] {name}{detail}")
        if not ok:
            failures.append(name)

    own = own_rows(n, cart)
    sizes = hpccoll.split_sizes(n, size)
    say(f"cg_poisson: {size} rank(s), {n} x {n} interior grid, rows split {list(sizes)}, rtol {rtol:g}")

    # (1), (2): the planned solve, gathered, against the serial direct solve.
    u, iters, relres = solve_distributed(n, cart, rtol, maxiter)
    check(
        f"planned CG converged to rtol {rtol:g}",
        relres <= rtol,
        f" ({iters} iterations, ||r|| / ||b|| = {relres:.3g})",
    )
    ref = serial_solve(rhs(n))
    err = float(np.linalg.norm(u - ref) / np.linalg.norm(ref))
    bound = condition_number(n) * rtol
    max_err = float(np.abs(u - ref).max())
    check(
        "gathered solution == serial direct solve",
        err <= bound,
        f" (max abs error {max_err:.3g}; relative 2-norm error {err:.3g}, bound cond(A) rtol = {bound:.3g})",
    )

    # (3) and the timing: the planned and the raw mpi4py loop, alternately, on the same problem.
    if args.rounds > 0:
        b = rhs(n)[own]
        seconds, results = time_loops(
            [lambda p: PlannedComms(p, cart), lambda p: RawComms(p, raw)],
            b,
            rtol,
            maxiter,
            args.rounds,
            raw.Barrier,
        )
        mine = u[own]
        diff = float(np.max([np.abs(x - mine).max() for runs in results for x, _ in runs]))
        counts = sorted({k for runs in results for _, k in runs})
        diff = comm.mpi.allreduce(np.inf if np.isnan(diff) else diff, op=MPI.MAX)  # a NaN must not lose the max
        check(
            "planned and raw mpi4py loops agree",
            counts == [iters] and diff <= 1e-12 * float(np.abs(ref).max()),
            f" ({2 * args.rounds} timed runs, iterations {counts}, max abs difference {diff:.3g})",
        )
        planned, plain = (comm.mpi.allreduce(statistics.median(s), op=MPI.MAX) for s in seconds)
        say(
            f"  time per iteration (median of {args.rounds} rounds, slowest rank): planned {1e6 * planned:.1f} us, "
            f"raw mpi4py {1e6 * plain:.1f} us, ratio planned/raw {planned / plain:.3f} (information, not a check)"
        )

    raw.Free()
    cart.free()
    if failures:
        say(f"cg_poisson: {len(failures)} check(s) FAILED: {failures}")
        return 1
    say(f"cg_poisson: all checks passed on {size} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
