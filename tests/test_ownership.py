"""A non-blocking call owns every buffer it handed the transport until it completes.

mpi4py 4.1 keeps no reference to the buffers of most of its non-blocking
collectives (``Iallreduce``, ``Iallgatherv``, ``Ireduce_scatter(_block)``):
when nothing else holds them, NumPy frees them at once and may hand the
memory to the next array of that size while MPI still reads it. MPICH
usually reads early and hides this; Open MPI returned garbage. These tests
fail on either MPI when a request lets go of a buffer before completion:
they watch every array passed to the transport's non-blocking primitives.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from conftest import all_ranks, assert_close, assert_same, make, reference
from mpi4py import MPI

import hpccoll

pytestmark = pytest.mark.mpi

PRIMITIVES = ("iallreduce", "ireduce_scatter", "iallgatherv", "ialltoallv")


@pytest.fixture
def watched(comm, monkeypatch):
    """Weak references to every ndarray handed to a non-blocking primitive of the NumPy transports."""
    refs = []
    seen = set()
    picked = [comm.transport_of("numpy", nbytes) for nbytes in (1, 1 << 30)]  # small and large, and the host
    for t in picked + [t.host for t in picked if getattr(t, "host", None) is not None]:  # transports they compose
        if id(t) in seen:
            continue
        seen.add(id(t))
        for name in PRIMITIVES:
            real = getattr(t, name)

            def spy(*args, _real=real, **kwargs):
                refs.extend(weakref.ref(a) for a in args if isinstance(a, np.ndarray))
                return _real(*args, **kwargs)

            monkeypatch.setattr(t, name, spy)
    return refs


def _alive_until_wait(comm, refs, req):
    gc.collect()
    alive = bool(refs) and all(r() is not None for r in refs)
    result = req.wait()
    return alive, result


def _stack(comm, shape, dtype, seed):
    return np.stack([make(shape, dtype, seed + 100 * r) for r in range(comm.size)])


@pytest.mark.skipif(MPI.COMM_WORLD.size == 1, reason="one rank: nothing is handed to MPI")
def test_single_array_calls_keep_their_buffers(comm, watched):
    p = comm.size
    stack = _stack(comm, (2 * p, 3), "float64", 1)
    calls = {
        "all_reduce": (
            lambda: hpccoll.all_reduce(stack[comm.rank].copy(), comm, async_op=True),
            lambda: reference(stack, "sum"),
        ),
        "reduce_scatter": (
            lambda: hpccoll.reduce_scatter(stack[comm.rank].copy(), comm, async_op=True),
            lambda: reference(stack, "sum")[2 * comm.rank : 2 * comm.rank + 2],
        ),
        "all_gather": (
            lambda: hpccoll.all_gather(stack[comm.rank].copy(), comm, axis=1, sizes=[3] * p, async_op=True),
            lambda: np.concatenate(list(stack), axis=1),
        ),
        "all_to_all": (
            lambda: hpccoll.all_to_all(stack[comm.rank].copy(), comm, sizes=[2] * p, recv_sizes=[2] * p, async_op=True),
            lambda: np.concatenate([stack[r][2 * comm.rank : 2 * comm.rank + 2] for r in range(p)]),
        ),
    }
    for name, (call, want) in calls.items():
        watched.clear()
        alive, got = _alive_until_wait(comm, watched, call())
        assert all_ranks(comm, alive), f"{name}: a buffer handed to MPI was freed before wait()"
        assert_close(got, want())


@pytest.mark.skipif(MPI.COMM_WORLD.size == 1, reason="one rank: nothing is handed to MPI")
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
def test_list_calls_keep_their_packed_buffers(comm, watched, collective, monkeypatch):
    monkeypatch.setattr(comm, "bucket_bytes", 64)  # several buckets, each packed into its own buffer
    p = comm.size
    shapes, dtypes = [(2 * p, 3), (p,), (3 * p, 2)], ["float32", "int64", "float64"]
    stacks = [_stack(comm, s, d, 10 + k) for k, (s, d) in enumerate(zip(shapes, dtypes))]
    xs = [s[comm.rank].copy() for s in stacks]
    req = getattr(hpccoll, collective)(xs, comm, async_op=True)  # all_to_all: block j of each array to rank j
    xs[:] = [np.full_like(x, 7) for x in xs]  # the caller replaces its arrays: the packed copies must live on
    alive, got = _alive_until_wait(comm, watched, req)
    assert all_ranks(comm, alive), "a packed buffer handed to MPI was freed before wait()"
    for g, s in zip(got, stacks):
        if collective == "all_reduce":
            assert_close(g, reference(s, "sum"))
        elif collective == "reduce_scatter":
            n = s.shape[1] // p
            assert_close(g, reference(s, "sum")[n * comm.rank : n * (comm.rank + 1)])
        elif collective == "all_gather":
            assert_same(g, np.concatenate(list(s)))
        else:
            n = s.shape[1] // p
            assert_same(g, np.concatenate([s[r][n * comm.rank : n * (comm.rank + 1)] for r in range(p)]))


def test_request_lets_go_after_completion(comm):
    """Ownership ends with the call: after wait() the request holds no buffer."""
    x = make((4, 3), "float64", 5 + comm.rank)
    req = hpccoll.all_reduce(x.copy(), comm, async_op=True)
    req.wait()
    assert req._owned is None and req._pending == []


@pytest.mark.skipif(MPI.COMM_WORLD.size == 1, reason="one rank: nothing is handed to MPI")
def test_freed_input_memory_reused_before_wait(comm):
    """The user-visible bug: the input's memory handed to a new array of the same size before wait()."""
    stack = _stack(comm, (4096,), "float64", 21)
    req = hpccoll.all_reduce(stack[comm.rank].copy(), comm, async_op=True)
    junk = [np.full(4096, 1e300) for _ in range(8)]  # would take over the freed input's memory
    got = req.wait()
    del junk
    assert_close(got, reference(stack, "sum"))
