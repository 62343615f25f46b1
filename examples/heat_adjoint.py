"""The gradient of a 2-D heat-equation misfit by the adjoint-state method, on a 2-D process grid.

Launch (any number of ranks; 1-4 checked by tests/test_example_heat.py):

    mpiexec -n 4 python -m mpi4py examples/heat_adjoint.py [--shape 25 19] [--steps 20] [--nu 0.2] [--periodic]

Forward model. The field ``u`` lives on a global ``NX x NY`` grid (default 25 x 19, so
that the blocks are uneven at every rank count above one), split into blocks over a
Cartesian process grid ``cart = comm.cartesian([0, 0], periodic=False)`` (MPI_Dims_create
picks the grid; ``numpy.array_split`` picks the extents). Each rank stores its owned block
inside one ghost layer (``halo=1``). An explicit Euler step of the heat equation with the
5-point Laplacian ``L`` reads::

    u_{t+1} = A u_t,    A = I + nu * L,    (L u)_ij = u_{i-1,j} + u_{i+1,j} + u_{i,j-1} + u_{i,j+1} - 4 u_ij

stable for ``nu <= 0.25``. In block form one step is ``A = I + nu * S H P``: ``P`` pads the
owned block with zero ghosts, ``H = hpccoll.halo_exchange`` fills every ghost that stands
for a cell of the domain from the rank that owns it, and ``S`` applies the stencil to the
padded block. By default the edges are not periodic: the ghosts beyond the edge of the
domain keep the zeros ``P`` put there (homogeneous Dirichlet boundary, ``u = 0`` outside).
With ``--periodic`` the grid wraps around both axes.

Misfit and gradient. After ``T`` steps the misfit is ``J(u_0) = 0.5 * ||u_T - d||^2``,
summed over ranks, with ``d`` a target field from a seeded RNG. Its gradient follows from
the adjoint-state method: with ``lambda_T = u_T - d``, march backward in time::

    lambda_t = A^T lambda_{t+1} = lambda_{t+1} + nu * P^T H^T S^T lambda_{t+1},    dJ/du_0 = lambda_0

``S^T`` scatters each owned cell's adjoint onto the padded block (into its four neighbours,
ghosts included, and -4 times into itself); ``H^T = hpccoll.halo_exchange_adjoint`` adds each
ghost's contribution into the owned cell it was copied from, on the rank that owns it; ``P^T``
keeps the owned block (the ghosts beyond a non-periodic edge held constants, so their
contributions are dropped). The model is linear, so the backward sweep needs no stored forward
states (a nonlinear one would store or recompute them).

Checks, each printed as ``[ok]`` or ``[FAILED]`` (exit status 0 only when every one passes):

1. the distributed ``u_T``, gathered on rank 0 with ``hpccoll.gather``, equals a serial
   NumPy simulation of the same global problem (exactly: the same arithmetic per cell);
2. the distributed gradient equals the serial NumPy adjoint gradient (rtol 1e-10);
3. a central finite difference of ``J`` along a random direction ``v`` matches ``<grad, v>``;
4. the dot test of the halo exchange, ``hpccoll.testing.dottest(hpccoll.HaloExchange(cart, halo=1), x, y)``;
5. the dot test of one distributed time step ``A`` against its hand-written adjoint ``A^T``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.testing import dottest


def stencil(p):
    """``L u``: the 5-point Laplacian of a ghost-padded block ``p``, on its interior."""
    return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4.0 * p[1:-1, 1:-1]


def stencil_transpose(g):
    """The transpose of :func:`stencil`: the padded block onto which an interior cotangent ``g`` scatters."""
    q = np.zeros((g.shape[0] + 2, g.shape[1] + 2) + g.shape[2:], dtype=g.dtype)
    q[:-2, 1:-1] += g
    q[2:, 1:-1] += g
    q[1:-1, :-2] += g
    q[1:-1, 2:] += g
    q[1:-1, 1:-1] -= 4.0 * g
    return q


class HeatStep:
    """One explicit Euler step ``A = I + nu * L`` on this rank's block, with its adjoint (collective).

    Parameters
    ----------
    cart : hpccoll.Communicator
        The Cartesian communicator the field is split over.
    nu : float
        The diffusion number (stable for ``nu <= 0.25``).
    """

    def __init__(self, cart, nu):
        self.comm = cart
        self.nu = nu

    def forward(self, u):
        """``A u``: pad with zero ghosts, fill them from the neighbours, apply the stencil.

        Parameters
        ----------
        u : numpy.ndarray
            This rank's owned block.

        Returns
        -------
        numpy.ndarray
            This rank's block of ``A u``.
        """
        p = np.pad(u, 1)  # the ghosts beyond a non-periodic edge stay 0 (Dirichlet)
        p = hpccoll.halo_exchange(p, self.comm, halo=1)
        return u + self.nu * stencil(p)

    def adjoint(self, lam):
        """``A^T lam``: the stencil's transpose onto the padded block, ghost contributions sent to their owners.

        Parameters
        ----------
        lam : numpy.ndarray
            This rank's owned block of the adjoint field.

        Returns
        -------
        numpy.ndarray
            This rank's block of ``A^T lam``.
        """
        q = hpccoll.halo_exchange_adjoint(stencil_transpose(lam), self.comm, halo=1)
        return lam + self.nu * q[1:-1, 1:-1]


def serial_step(U, nu, periodic):
    """One step of the serial reference on the whole grid."""
    return U + nu * stencil(np.pad(U, 1, mode="wrap" if periodic else "constant"))


def serial_step_adjoint(G, nu, periodic):
    """The transpose of :func:`serial_step`, written out: scatter, then fold (periodic) or drop the ghost ring."""
    Q = stencil_transpose(G)
    if periodic:  # a ghost stands for the cell on the other side: wrap its contribution around
        Q[1, :] += Q[-1, :]
        Q[-2, :] += Q[0, :]
        Q[:, 1] += Q[:, -1]
        Q[:, -2] += Q[:, 0]
    return G + nu * Q[1:-1, 1:-1]


def assemble(blocks, coords, xs, ys):
    """The global field from the raveled blocks of every rank (rank r's block at grid ``coords[r]``)."""
    U = np.empty((sum(xs), sum(ys)))
    offset = 0
    for cx, cy in coords:
        x0, y0 = sum(xs[:cx]), sum(ys[:cy])
        n = xs[cx] * ys[cy]
        U[x0 : x0 + xs[cx], y0 : y0 + ys[cy]] = blocks[offset : offset + n].reshape(xs[cx], ys[cy])
        offset += n
    return U


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=[25, 19], metavar=("NX", "NY"), help="global grid")
    parser.add_argument("--steps", type=int, default=20, help="time steps T")
    parser.add_argument("--nu", type=float, default=0.2, help="diffusion number (stable for nu <= 0.25)")
    parser.add_argument("--periodic", action="store_true", help="wrap around both axes (default: Dirichlet 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eps", type=float, default=1e-3, help="finite-difference step")
    args = parser.parse_args(argv)
    (NX, NY), T, nu = args.shape, args.steps, args.nu

    comm = hpccoll.Communicator()
    cart = comm.cartesian([0, 0], periodic=args.periodic)
    rank, size = comm.rank, comm.size
    say = print if rank == 0 else (lambda *a, **k: None)
    failures = []

    def check(name, ok, detail=""):
        ok = comm.mpi.allreduce(bool(ok), op=MPI.LAND)
        say(f"  [{'ok' if ok else 'FAILED'}] {name}{detail}")
        if not ok:
            failures.append(name)

    xs, ys = hpccoll.split_sizes(NX, cart.dims[0]), hpccoll.split_sizes(NY, cart.dims[1])
    cx, cy = cart.coords
    x0, y0 = sum(xs[:cx]), sum(ys[:cy])
    own = (slice(x0, x0 + xs[cx]), slice(y0, y0 + ys[cy]))
    edges = "periodic" if args.periodic else "Dirichlet 0"
    say(
        f"heat_adjoint: {size} rank(s) on a {cart.dims[0]} x {cart.dims[1]} grid, global {NX} x {NY} "
        f"(blocks {list(xs)} x {list(ys)}), T={T}, nu={nu}, {edges} edges"
    )

    rng = np.random.default_rng(args.seed)  # the global problem, the same on every rank
    U0 = rng.standard_normal((NX, NY))
    D = rng.standard_normal((NX, NY))  # the target field d
    V = rng.standard_normal((NX, NY))  # the finite-difference direction
    step = HeatStep(cart, nu)

    def simulate(u0):
        u = u0
        for _ in range(T):
            u = step.forward(u)
        return u

    def misfit(u0):
        r = simulate(u0) - D[own]
        return float(hpccoll.all_reduce(np.float64(0.5 * np.vdot(r, r)), comm))

    # Forward, then the adjoint-state sweep backward in time.
    uT = simulate(U0[own])
    lam = uT - D[own]  # lambda_T = dJ/du_T
    for _ in range(T):
        lam = step.adjoint(lam)
    grad = lam  # dJ/du_0, this rank's block

    # The serial reference: the whole grid on every rank, its adjoint written out independently.
    UT = U0
    for _ in range(T):
        UT = serial_step(UT, nu, args.periodic)
    G = UT - D
    for _ in range(T):
        G = serial_step_adjoint(G, nu, args.periodic)

    # (1), (2): gather every block on rank 0 and compare there with the serial run.
    coords = hpccoll.all_gather(np.asarray(cart.coords, dtype=np.int64)[None], comm).tolist()
    got_uT = hpccoll.gather(uT.ravel(), comm, root=0)
    got_grad = hpccoll.gather(grad.ravel(), comm, root=0)
    if rank == 0:
        got_uT, got_grad = assemble(got_uT, coords, xs, ys), assemble(got_grad, coords, xs, ys)
        err_uT = float(np.abs(got_uT - UT).max())
        err_grad = float(np.abs(got_grad - G).max() / np.abs(G).max())
    else:
        err_uT = err_grad = 0.0
    err_uT, err_grad = comm.mpi.bcast((err_uT, err_grad), root=0)
    check("u_T (gathered) == serial NumPy simulation", err_uT == 0.0, f" (max abs difference {err_uT:.3g})")
    check("gradient == serial NumPy adjoint gradient", err_grad <= 1e-10, f" (max relative error {err_grad:.3g})")

    # (3): J is quadratic in u_0, so the central difference is exact up to rounding.
    fd = (misfit(U0[own] + args.eps * V[own]) - misfit(U0[own] - args.eps * V[own])) / (2 * args.eps)
    ad = float(hpccoll.all_reduce(np.float64(np.vdot(grad, V[own])), comm))
    fd_err = abs(fd - ad) / abs(ad)
    check(
        "finite difference of J == <grad, v>",
        fd_err <= 1e-5,
        f" ({fd:.10f} vs {ad:.10f}, relative {fd_err:.2g}; J = {misfit(U0[own]):.6f})",
    )

    # (4), (5): collective dot tests, with different vectors on every rank.
    local = np.random.default_rng(1000 + rank)
    padded = (xs[cx] + 2, ys[cy] + 2)
    halo_op = hpccoll.HaloExchange(cart, halo=1)
    ok = dottest(halo_op, local.standard_normal(padded), local.standard_normal(padded), raise_error=False)
    check("dottest HaloExchange(cart, halo=1)", ok)
    block = (xs[cx], ys[cy])
    ok = dottest(step, local.standard_normal(block), local.standard_normal(block), raise_error=False)
    check("dottest one time step A against A^T", ok)

    cart.free()
    if failures:
        say(f"heat_adjoint: {len(failures)} check(s) FAILED: {failures}")
        return 1
    say(f"heat_adjoint: all checks passed on {size} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
