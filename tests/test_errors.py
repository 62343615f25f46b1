"""Bad input: a clear exception naming the argument, raised before any communication."""

import numpy as np
import pytest
from conftest import agree, raises_everywhere
from mpi4py import MPI

import hpccoll
from hpccoll import ArgumentError, DTypeError, UnsupportedOpError

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda c: hpccoll.all_gather(np.ones(3), c, axis=1), ArgumentError, r"axis: expected an int in \[-1, 0\]"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, axis=1.0), ArgumentError, "axis: expected an int; got float"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, axis=True), ArgumentError, "axis: expected an int; got bool"),
        (lambda c: hpccoll.all_gather(np.float64(1), c), ArgumentError, "at least 1 dimension"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, sizes=[3] * (c.size + 1)), ArgumentError, "sizes: expected"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, sizes=[-1] * c.size), ArgumentError, "non-negative"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, sizes="abc"), ArgumentError, "sizes: expected"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, sizes=[4] * c.size), ArgumentError, r"sizes\[\d\] == x.shape"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, out=np.empty(2)), ArgumentError, "out: expected shape"),
        (lambda c: hpccoll.all_gather(np.ones(3), c, out=[0.0] * 3 * c.size), ArgumentError, "out: expected a numpy"),
        (lambda c: hpccoll.all_gather(np.array(["a"]), c), DTypeError, "x: expected a native"),
        (lambda c: hpccoll.all_gather(np.ones(2, ">f8"), c), DTypeError, "native-byte-order"),
        (lambda c: hpccoll.all_gather(np.ones(2, "M8[s]"), c), DTypeError, "datetime64"),
        (lambda c: hpccoll.all_gather([[1], [2, 3]], c), ArgumentError, "x: expected"),
        (lambda c: hpccoll.reduce_scatter(np.ones(4), c, op="mean"), ArgumentError, "op: expected one of"),
        (
            lambda c: hpccoll.reduce_scatter(np.ones(4), c, op=MPI.LAND),
            DTypeError,
            r"op='land' \(MPI\.LAND\): expected a bool or integer dtype .*; got float64",
        ),
        (lambda c: hpccoll.reduce_scatter(np.ones(4), c, op=MPI.MAXLOC), ArgumentError, r"; got MPI\.MAXLOC$"),
        (lambda c: hpccoll.reduce_scatter(np.ones(4), c, sizes=[5] + [0] * (c.size - 1)), ArgumentError, "summing to"),
        (lambda c: hpccoll.reduce_scatter(np.ones(4, "i4"), c, op="avg"), DTypeError, "op='avg'"),
        (lambda c: hpccoll.reduce_scatter(np.ones(4, "c8"), c, op="max"), DTypeError, "not ordered"),
        (lambda c: hpccoll.all_reduce(np.ones(4), c, out=np.empty(4, "f4")), ArgumentError, "out: expected dtype"),
        (lambda c: hpccoll.all_reduce(np.ones(4, bool), c, op="avg"), DTypeError, "op='avg'"),
        (lambda c: hpccoll.all_reduce_adjoint(np.ones(4), c, cotangent="same"), ArgumentError, "cotangent: expected"),
        (lambda c: hpccoll.all_reduce_adjoint(np.ones(4), c, op="max"), UnsupportedOpError, "'max'"),
        (lambda c: hpccoll.reduce_scatter_adjoint(np.ones(4, "i8"), c, op="avg"), DTypeError, "op='avg'"),
        (lambda c: hpccoll.all_gather(np.ones(3), comm=MPI.COMM_NULL), ArgumentError, "COMM_NULL"),
        (lambda c: hpccoll.all_gather(np.ones(3), comm=42), ArgumentError, "comm: expected"),
        (lambda c: hpccoll.AllGather(c, sizes=[1] * (c.size + 1)), ArgumentError, "sizes: expected"),
        (lambda c: hpccoll.Communicator(transport="carrier-pigeon"), ArgumentError, "transport: expected one of"),
        (lambda c: hpccoll.Communicator(check="yes"), ArgumentError, "check: expected"),
    ],
)
def test_bad_arguments(comm, call, exc, match):
    raises_everywhere(comm, exc, match, lambda: call(comm), same_message=False)  # some messages name the rank


def test_errors_share_a_base_and_builtin_kinds():
    for cls in (ArgumentError, DTypeError, UnsupportedOpError, hpccoll.MismatchError, hpccoll.TransportUnavailable):
        assert issubclass(cls, hpccoll.HpccollError)
    assert issubclass(ArgumentError, ValueError) and issubclass(DTypeError, TypeError)


def test_out_must_not_overlap_the_input(comm):
    buf = np.zeros(8 * comm.size)
    x = buf[1:4]  # overlaps out, but is no rank's block of it (that would be the in-place form)
    raises_everywhere(comm, ArgumentError, "overlaps", lambda: hpccoll.all_gather(x, comm, out=buf[: 3 * comm.size]))
    raises_everywhere(comm, ArgumentError, "overlaps", lambda: hpccoll.all_reduce(buf[:4], comm, out=buf[1:5]))
    ro = np.empty(3 * comm.size)
    ro.flags.writeable = False
    raises_everywhere(comm, ArgumentError, "writeable", lambda: hpccoll.all_gather(x, comm, out=ro))


def test_interleaved_views_are_not_overlap(comm):
    buf = np.arange(8.0)
    out = hpccoll.all_reduce(buf[::2], comm, out=buf[1::2])
    agree(comm, lambda: np.testing.assert_array_equal(out, np.arange(0.0, 8.0, 2.0) * comm.size))


def test_env_values_are_validated(comm, monkeypatch):
    monkeypatch.setenv("HPCCOLL_CHECK", "maybe")
    raises_everywhere(comm, ArgumentError, "HPCCOLL_CHECK: expected", hpccoll.Communicator)
    monkeypatch.setenv("HPCCOLL_CHECK", "0")
    monkeypatch.setenv("HPCCOLL_TRANSPORT", "tcp")
    raises_everywhere(comm, ArgumentError, "HPCCOLL_TRANSPORT: expected one of", hpccoll.Communicator)


@pytest.mark.parametrize("form", ["single", "shared"])
def test_zero_d_all_gather_says_what_a_gather_needs(comm, form):
    """A 0-D shard has no axis to join along: the message says concatenate (not split) and how to fix it."""
    x = np.float64(1.0).reshape(())
    call = {"single": lambda: hpccoll.all_gather(x, comm), "shared": lambda: hpccoll.all_gather(x, comm, out="shared")}[
        form
    ]
    if form == "shared" and comm.size > 1 and comm.transport_instance("shm").unavailable_reason(comm):
        pytest.skip("no node-shared memory here")
    raises_everywhere(
        comm,
        ArgumentError,
        r"at least 1 dimension to concatenate along axis; got a 0-D array "
        r"\(all_gather joins the shards along an existing axis",
        call,
    )


def test_16_bit_floats_move_as_uint16_where_mpi_has_no_float16(comm, monkeypatch):
    """MPIs before MPI 4 have no float16 datatype (mpi4py on Debian's Open MPI 4.1 cannot map 'e'):
    gathers and all-to-alls of 16-bit floats move their bits as uint16 and never ask MPI for float16."""
    from hpccoll.transports import _mpitypes

    real = _mpitypes.mpi_datatype

    def no_float16(dtype):
        if dtype == np.float16:
            raise ValueError("cannot map code 'e' to MPI datatype")
        return real(dtype)

    monkeypatch.setattr(_mpitypes, "mpi_datatype", no_float16)
    monkeypatch.setattr(_mpitypes, "_DATATYPES", {k: v for k, v in _mpitypes._DATATYPES.items() if k != np.float16})
    import hpccoll.transports.host_mpi as host_mpi

    monkeypatch.setattr(host_mpi, "mpi_datatype", no_float16)
    monkeypatch.setattr(host_mpi, "_DATATYPES", _mpitypes._DATATYPES)
    p = comm.size
    xs = [(np.arange(2 * p) / 3 + r).astype(np.float16) for r in range(p)]
    gathered = hpccoll.all_gather(xs[comm.rank], comm, sizes=[2 * p] * p)
    swapped = hpccoll.all_to_all(xs[comm.rank], comm, sizes=[2] * p, recv_sizes=[2] * p)
    agree(comm, gathered.tobytes() == np.concatenate(xs).tobytes(), "all_gather of float16")
    agree(
        comm,
        swapped.tobytes() == np.concatenate([x[2 * comm.rank : 2 * comm.rank + 2] for x in xs]).tobytes(),
        "all_to_all of float16",
    )
