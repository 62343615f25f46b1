"""The dtype rules of ``hpccoll._dtypes`` for a transport whose library lacks dtypes (``Transport.reduce_dtypes``).

A transport declares the dtype names its library reduces elementwise natively
(``None``: every dtype, as MPI does); ``_dtypes`` decides once how the others
are reduced (int16/uint16 widened to 32 bits, complex sum as twice as many
reals, complex prod by whole blocks, complex max/min refused) and moved (as
itself, as reals, or as bytes). The rules are checked on their own, then over
the NCCL transport on the stand-in GPU (``tests/standin_nccl.py``), whose
results are compared with NumPy.
"""

# ruff: noqa: F811 - the stand-in's fixtures (imported below) are this module's test arguments

import numpy as np
import pytest
import standin_nccl as standin
from conftest import agree, assert_same
from test_nccl_standin import calls, dev, fresh, gpu, host, nccl_of, runtime  # noqa: F401 - fixtures

import hpccoll
from hpccoll._dtypes import (
    SUPPORTED_DTYPES,
    LibraryReduction,
    LibraryWire,
    library_move_wire,
    library_reduce_wire,
    library_reduction,
)
from hpccoll.transports import nccl as nccl_mod
from hpccoll.transports._base import Transport

pytestmark = pytest.mark.mpi

#: A library with NCCL's integers and floats but neither 16-bit integers nor 16-bit floats.
LACKING = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "float32", "float64"})
BASIC = ("sum", "prod", "max", "min")


class Lacking(Transport):
    """A transport (never instantiated over a network) declaring :data:`LACKING`."""

    name = "lacking"
    array_kind = "numpy"
    reduce_dtypes = LACKING


def dtypes():
    """Every supported dtype that NumPy can make here (the float8 and bfloat16 ones need ml_dtypes)."""
    made = []
    for name in SUPPORTED_DTYPES:
        try:
            made.append(np.dtype(name))
        except TypeError:
            made.append(hpccoll._dtypes.ml_dtype(name))
    return made


# --------------------------------------------------------------------------- the rules on their own


@pytest.mark.parametrize("name,wider", [("int16", "int32"), ("uint16", "uint32")])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_lacking_16_bit_integers_are_widened(name, wider, op):
    route = library_reduction(np.dtype(name), op, Lacking.reduce_dtypes)
    assert route == LibraryReduction("widen", LibraryWire(np.dtype(wider), 1))
    assert library_reduce_wire(np.dtype(name), Lacking.reduce_dtypes) is None
    assert library_move_wire(np.dtype(name), Lacking.reduce_dtypes) == LibraryWire(np.dtype(np.uint8), 2)


@pytest.mark.parametrize("name", ["int16", "uint16"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_widened_result_wraps_like_numpy(name, op):
    """Reduced in the wire dtype and cast back, a 16-bit sum or product wraps exactly as NumPy's."""
    dtype = np.dtype(name)
    info = np.iinfo(dtype)
    stack = np.array([[info.max, info.min, info.max - 3, 7], [info.max, info.min, 9, info.max], [3, -1, 250, 2]])
    stack = stack.astype(dtype)  # -1 -> uint16's max: wrapping in the input too
    route = library_reduction(dtype, op, Lacking.reduce_dtypes)
    ufunc = {"sum": np.add, "prod": np.multiply}[op]
    on_wire = ufunc.reduce(stack.astype(route.wire.view), axis=0, dtype=route.wire.view)
    got = on_wire.astype(dtype)
    want = ufunc.reduce(stack, axis=0, dtype=dtype)
    assert got.dtype == dtype
    assert_same(got, want)
    assert not np.array_equal(ufunc.reduce(stack.astype(np.int64), axis=0), want.astype(np.int64))  # it did wrap


def test_present_16_bit_integers_are_native():
    with16 = LACKING | {"int16"}
    assert library_reduction(np.dtype(np.int16), "sum", with16) == LibraryReduction(
        "native", LibraryWire(np.dtype(np.int16), 1)
    )


def test_no_wider_integer_refused():
    """Widening needs the wider integer: a library without int32 refuses int16, naming the dtype."""
    with pytest.raises(hpccoll.DTypeError, match=r"x: expected a dtype NCCL reduces \(.*\); got int16"):
        library_reduction(np.dtype(np.int16), "sum", frozenset({"float32"}), "NCCL")


@pytest.mark.parametrize("name,real", [("complex64", "float32"), ("complex128", "float64")])
def test_complex_sum_as_pairs_of_reals(name, real):
    dtype, wire = np.dtype(name), LibraryWire(np.dtype(real), 2)
    assert library_reduction(dtype, "sum", LACKING) == LibraryReduction("reals", wire)
    assert library_reduction(dtype, "prod", LACKING) == LibraryReduction("complex_prod", wire)
    assert library_reduce_wire(dtype, LACKING) == wire
    assert library_move_wire(dtype, LACKING) == wire
    x = (np.arange(4) + 1j * np.arange(4, 8)).astype(dtype)
    y = (np.arange(3, 7) - 2j).astype(dtype)
    pairs = x.view(wire.view) + y.view(wire.view)  # sum, elementwise on the reals
    assert pairs.size == wire.scale * x.size
    assert_same(pairs.view(dtype), x + y)


@pytest.mark.parametrize("name", ["complex64", "complex128"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_complex_max_min_refused_naming_the_dtype(name, op):
    for _ in range(2):  # cached: refused again, with a fresh exception
        with pytest.raises(hpccoll.DTypeError, match=rf"op='{op}': expected 'sum' or 'prod' for complex {name}"):
            library_reduction(np.dtype(name), op, LACKING)


def test_complex_without_its_real_part_refused():
    with pytest.raises(hpccoll.DTypeError, match="got complex128"):
        library_reduction(np.dtype(np.complex128), "sum", frozenset({"float32"}))
    assert library_move_wire(np.dtype(np.complex128), frozenset({"float32"})) == LibraryWire(np.dtype(np.uint8), 16)


@pytest.mark.parametrize("name", ["bool", "float16", ">f4", "<i2"])
def test_lacking_dtypes_move_as_bytes(name):
    dtype = np.dtype(name)
    assert library_move_wire(dtype, LACKING) == LibraryWire(np.dtype(np.uint8), dtype.itemsize)


def test_non_native_byte_order_is_never_reduced():
    """``>f4`` is named ``float32``, but its bytes are not the library's float32."""
    with pytest.raises(hpccoll.DTypeError, match="expected a dtype the transport reduces"):
        library_reduction(np.dtype(">f4"), "sum", LACKING)


@pytest.mark.parametrize("op", BASIC)
def test_every_dtype_unaffected_without_reduce_dtypes(op):
    """``reduce_dtypes=None`` (the default, MPI's): every dtype reduces and moves as itself."""
    assert Transport.reduce_dtypes is None
    for dtype in dtypes():
        assert library_reduction(dtype, op, None) == LibraryReduction("native", LibraryWire(dtype, 1))
        assert library_move_wire(dtype, None) == LibraryWire(dtype, 1)


def test_host_transport_declares_none(comm):
    assert comm.host_transport().reduce_dtypes is None


def test_int16_all_reduce_unaffected_on_host(comm):
    """With ``reduce_dtypes=None`` the collectives' own plan decides: int16 sums still wrap like NumPy."""
    x = np.full(3, np.iinfo(np.int16).max - comm.rank, np.int16)
    got = hpccoll.all_reduce(x, comm)
    want = np.add.reduce(
        np.stack([np.full(3, np.iinfo(np.int16).max - r, np.int16) for r in range(comm.size)]), axis=0, dtype=np.int16
    )
    assert got.dtype == np.int16
    assert_same(got, want)


# --------------------------------------------------------------------------- over NCCL (the stand-in)


def test_nccl_declares_the_binding_types(gpu):
    t = nccl_of(gpu)
    want = frozenset(name for name, const in nccl_mod._NCCL_TYPES.items() if hasattr(standin, const))
    assert t.reduce_dtypes == want and "int16" not in want and "bool" not in want
    assert nccl_mod.NcclTransport.reduce_dtypes == frozenset(nccl_mod._NCCL_TYPES)


def test_nccl_without_bfloat16_before_2_10(fresh, runtime, monkeypatch):
    monkeypatch.setattr(standin, "VERSION", 20903)
    c = fresh()
    t = nccl_of(c)
    route = library_reduction(np.dtype(np.float32), "sum", t.reduce_dtypes)
    assert "bfloat16" not in t.reduce_dtypes and "float16" in t.reduce_dtypes
    assert route.how == "native"


@pytest.mark.parametrize("name", ["int16", "uint16"])
def test_nccl_int16_sum_on_int32_wraps_like_numpy(gpu, name):
    dtype = np.dtype(name)
    top = np.iinfo(dtype).max
    stack = np.stack([np.array([top - r, top, 1 + r, 0], dtype) for r in range(gpu.size)])
    got = host(hpccoll.all_reduce(dev(stack[gpu.rank]), gpu, op="sum"))
    wires = {call[2] for call in calls(gpu)}
    want = np.add.reduce(stack, axis=0, dtype=dtype)
    assert got.dtype == dtype
    assert_same(got, want)
    wide = standin.NCCL_INT32 if name == "int16" else standin.NCCL_UINT32
    agree(gpu, gpu.size == 1 or wires == {wide}, f"NCCL datatypes {wires}")


@pytest.mark.parametrize("name,real", [("complex64", "NCCL_FLOAT32"), ("complex128", "NCCL_FLOAT64")])
def test_nccl_complex_sum_as_pairs_of_reals(gpu, name, real):
    dtype = np.dtype(name)
    stack = np.stack([(np.arange(5) * (r + 1) + 1j * (r - np.arange(5))).astype(dtype) for r in range(gpu.size)])
    got = host(hpccoll.all_reduce(dev(stack[gpu.rank]), gpu, op="sum"))
    made = calls(gpu)
    assert_same(got, np.add.reduce(stack, axis=0))
    want = [("allReduce", 10, getattr(standin, real), standin.NCCL_SUM)]
    agree(gpu, gpu.size == 1 or [call[:4] for call in made] == want, f"NCCL calls {made}")


@pytest.mark.parametrize("op", ["max", "min"])
def test_nccl_complex_max_refused_naming_the_dtype(gpu, op):
    t = nccl_of(gpu)
    x = dev(np.ones(3, np.complex128))
    for call in (lambda: t.allreduce(None, x, op), lambda: t.reduce(None, x, op, 0)):
        with pytest.raises(hpccoll.DTypeError, match=f"op='{op}': expected 'sum' or 'prod' for complex complex128"):
            call()
    assert calls(gpu) == []
