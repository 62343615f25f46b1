"""Distributed 2-D FFT with one hpccoll.all_to_all: row FFTs, a transpose, column FFTs.

Launch (any number of ranks):

    mpiexec -n 4 python -m mpi4py examples/pencil_fft.py [--backend numpy|cupy] [--shape N0 N1] [--check]

An N0 x N1 complex array is distributed by rows (numpy.array_split's). Each
rank FFTs its rows along axis 1; an all-to-all turns its rows into columns
(split along axis 1, concatenated along axis 0: the transpose at the heart of
pencil and slab decompositions); each rank then FFTs its columns along
axis 0. The result is the 2-D FFT, distributed by columns. It is checked
against numpy.fft.fft2 of the gathered array, the inverse transform is
checked to bring the rows back, and the adjoint (column inverse FFTs times
N0, the all-to-all back, row inverse FFTs times N1) passes
hpccoll.testing.dottest. Exit status 0 means every check passed on every rank.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.testing import dottest


class PencilFFT2:
    """The 2-D FFT of an array distributed by rows, as an operator: rows in, columns of the FFT out.

    ``comm`` is an :class:`hpccoll.Communicator`; ``xp`` the array module.

    ``forward`` maps this rank's ``(rows[rank], N1)`` block of ``x`` to its
    ``(N0, cols[rank])`` block of ``numpy.fft.fft2(x)``; ``adjoint`` is its
    adjoint under the inner product summed over ranks (``N0 * N1`` times the
    inverse); ``inverse`` undoes ``forward``.
    """

    def __init__(self, comm: Any, shape: Tuple[int, int], xp: Any = np) -> None:
        self.comm, self.shape, self.xp = comm, shape, xp
        n0, n1 = shape
        self.rows = hpccoll.split_sizes(n0, self.comm.size)
        self.cols = hpccoll.split_sizes(n1, self.comm.size)
        # Both extents are known, so no call needs a size exchange.
        self.transpose = hpccoll.AllToAll(self.comm, split_axis=1, concat_axis=0, sizes=self.cols, recv_sizes=self.rows)
        self._columns: Optional[Any] = None  # the transpose's output, reused from call to call

    def forward(self, x: Any, out: Any = None) -> Any:
        xp = self.xp
        rows = xp.fft.fft(x, axis=1)
        if self._columns is None or self._columns.dtype != rows.dtype:
            self._columns = xp.empty((self.shape[0], self.cols[self.comm.rank]), rows.dtype)
        columns = self.transpose.forward(rows, out=self._columns)
        return xp.fft.fft(columns, axis=0)

    def adjoint(self, y: Any, out: Any = None) -> Any:
        xp = self.xp
        n0, n1 = self.shape
        columns = xp.fft.ifft(y, axis=0) * n0
        return xp.fft.ifft(self.transpose.adjoint(columns), axis=1) * n1

    def inverse(self, y: Any) -> Any:
        return self.adjoint(y) / (self.shape[0] * self.shape[1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="array library (default numpy)")
    parser.add_argument(
        "--shape", type=int, nargs=2, default=(64, 45), metavar=("N0", "N1"), help="global array shape (default 64 45)"
    )
    parser.add_argument("--check", action="store_true", help="turn on the cross-rank argument check")
    args = parser.parse_args(argv)
    xp = np
    if args.backend == "cupy":
        import cupy as xp  # noqa: F811 - needs a GPU transport (see docs)

    comm = hpccoll.Communicator(check=args.check)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    fft = PencilFFT2(comm, tuple(args.shape), xp)
    n0, n1 = fft.shape
    rng = np.random.default_rng(7)
    full = rng.standard_normal((n0, n1)) + 1j * rng.standard_normal((n0, n1))  # the same on every rank
    r0, r1 = sum(fft.rows[: comm.rank]), sum(fft.rows[: comm.rank + 1])
    c0, c1 = sum(fft.cols[: comm.rank]), sum(fft.cols[: comm.rank + 1])
    x = xp.asarray(full[r0:r1])

    y = fft.forward(x)
    gathered = hpccoll.all_gather(x, comm)  # the whole array, to check against the serial FFT
    want = np.fft.fft2(_host(gathered))[:, c0:c1]
    checks = {
        f"forward == numpy.fft.fft2 of the gathered {n0} x {n1} array (this rank's columns)": np.allclose(
            _host(y), want, rtol=1e-10, atol=1e-10 * n0 * n1
        ),
        "inverse(forward(x)) == x": np.allclose(_host(fft.inverse(y)), full[r0:r1], rtol=1e-10, atol=1e-10),
    }
    g = xp.asarray(rng.standard_normal(want.shape) + 1j * rng.standard_normal(want.shape))  # differs by rank
    checks["adjoint passes the collective dot test"] = dottest(fft, x, g, raise_error=False)
    say(f"pencil FFT of a {n0} x {n1} array on {comm.size} rank(s), backend={args.backend}")
    failed = 0
    for name, ok in checks.items():
        ok = comm.mpi.allreduce(bool(ok), op=MPI.LAND)
        say(f"  [{'ok' if ok else 'FAILED'}] {name}")
        failed += not ok
    say("all checks passed" if not failed else f"{failed} check(s) FAILED")
    comm.free()
    return 1 if failed else 0


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


if __name__ == "__main__":
    sys.exit(main())
