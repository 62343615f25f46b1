"""hpccoll's own cost per call: the collectives against a null MPI communicator, in one process.

Run: ``python benchmarks/overhead.py`` (no mpiexec; ``--gpu-only`` for the GPU transport section;
``--before REV`` for the list forms of git revision ``REV`` and of the working tree, timed in alternation).

A :class:`hpccoll.Communicator` of size 2 whose MPI calls do nothing stands
in for a real one, so what is timed is hpccoll's Python work alone --
validation, dispatch, output allocation, packing -- next to a "raw" line that
builds the same mpi4py call arguments and makes the same null call. The
difference is what hpccoll adds to every call, before any data moves; it
does not depend on the network, so it is steadier than a 2-rank timing (which
``benchmarks/bench_quick.py`` does for the real thing).

The GPU transport section does the same for the ``nccl`` and ``staged``
transports on any machine, GPU or not: the real transports and the real
``CupyRuntime`` run over a CuPy stand-in whose device calls (stream queries,
``cudaMemcpyAsync``, events) do nothing and a no-op ``NcclCommunicator``, next
to the raw calls a user would make through the same runtime (the same shape
of work, no device). What is left is hpccoll's Python per call at the
transport level; the target is <= 1.0 us for allgatherv, reduce_scatter and
allreduce (issue 12). On a GPU, ``make bench-gpu`` measures the real thing.
"""

from __future__ import annotations

import sys
import time
import timeit
from types import SimpleNamespace
from typing import Any, List, Tuple

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll._comm import Communicator


class NullMPI:
    """The mpi4py calls hpccoll's host transport makes, doing nothing."""

    def Allreduce(self, send, recv, op):  # noqa: N802 - mpi4py's names
        pass

    def Allgather(self, send, recv):  # noqa: N802
        pass

    def Reduce_scatter_block(self, send, recv, op):  # noqa: N802
        pass

    def Allgatherv(self, send, recv):  # noqa: N802 - the uneven calls, for older versions' list paths
        pass

    def Reduce_scatter(self, send, recv, counts, op):  # noqa: N802
        pass


def best_ns(stmt: str, env: dict, number: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e9


def paired_ns(raw_stmt: str, stmt: str, env: dict, number: int, repeat: int) -> Tuple[float, float]:
    """Best per-call ns of ``raw_stmt`` and ``stmt``, timed in alternating repeats.

    Timed in this process's CPU time, not wall time: on a shared machine a
    process that is switched out does not count that time, so the figures
    hold under load (the work is pure Python, with no waiting).
    """
    raw = timeit.Timer(raw_stmt, globals=env, timer=time.process_time)
    ours = timeit.Timer(stmt, globals=env, timer=time.process_time)
    best_raw = best = float("inf")
    for _ in range(repeat):
        best_raw = min(best_raw, raw.timeit(number))
        best = min(best, ours.timeit(number))
    return best_raw / number * 1e9, best / number * 1e9


# --------------------------------------------------------------------------- the GPU transports, no device


class _Stream:
    """``cupy.cuda.Stream`` as the runtime uses it; nothing is queued anywhere."""

    ptr = 0x5EED

    def synchronize(self) -> None:
        pass

    def record(self, event: Any = None) -> Any:
        return event if event is not None else _Event()

    def is_capturing(self) -> bool:
        return False


class _Event:
    done = True

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        pass

    def synchronize(self) -> None:
        pass


_STREAM = _Stream()


class _CudaRuntimeAPI:
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802 - CuPy's name
        pass

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802
        return 1

    @staticmethod
    def getDevice() -> int:  # noqa: N802
        return 0


class _Device:
    pci_bus_id = "0000:01:00.0"

    def __init__(self, device: int = 0) -> None:
        self.id = device

    def use(self) -> None:
        pass


#: The parts of ``cupy`` that hpccoll's ``CupyRuntime`` calls, doing nothing.
NULL_CUPY = SimpleNamespace(
    __name__="cupy (no device)",
    cuda=SimpleNamespace(
        get_current_stream=lambda device_id=-1: _STREAM,
        Event=_Event,
        runtime=_CudaRuntimeAPI,
        Device=_Device,
        alloc_pinned_memory=bytearray,
    ),
)


class NullNcclCommunicator:
    """``cupy.cuda.nccl.NcclCommunicator`` whose calls do nothing."""

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:  # noqa: N803 - CuPy's names
        pass

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        pass

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        pass

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        pass

    def check_async_error(self) -> None:
        pass

    def destroy(self) -> None:
        pass

    abort = destroy


def _null_nccl() -> Any:
    names = [
        "NCCL_INT8",
        "NCCL_UINT8",
        "NCCL_INT32",
        "NCCL_UINT32",
        "NCCL_INT64",
        "NCCL_UINT64",
        "NCCL_FLOAT16",
        "NCCL_FLOAT32",
        "NCCL_FLOAT64",
        "NCCL_BFLOAT16",
    ]
    module = SimpleNamespace(**{name: code for code, name in enumerate(names)})
    module.__dict__.update(
        NCCL_SUM=0,
        NCCL_PROD=1,
        NCCL_MAX=2,
        NCCL_MIN=3,
        NcclCommunicator=NullNcclCommunicator,
        get_unique_id=lambda: bytes(128),
        get_version=lambda: 22809,
        groupStart=lambda: None,
        groupEnd=lambda: None,
    )
    return module


class DeviceArray:
    """What the GPU transports read from a CuPy array: dtype, sizes and ``.data.ptr``/``.data.device_id``."""

    __slots__ = ("data", "dtype", "size", "itemsize", "nbytes")

    def __init__(self, n: int, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.size, self.itemsize = n, self.dtype.itemsize
        self.nbytes = n * self.itemsize
        self.data = SimpleNamespace(ptr=0x7F0000000000 + 256 * id(self) % 2**32, device_id=0)


def gpu_section(number: int = 10_000, repeat: int = 31) -> List[Tuple[str, float, float]]:
    """The nccl and staged transports over the no-device runtime: (call, raw ns, hpccoll ns) rows."""
    from hpccoll.transports._cuda import CupyRuntime, use_runtime

    class NoDeviceRuntime(CupyRuntime):
        def __init__(self) -> None:  # CupyRuntime's methods over NULL_CUPY (no import of CuPy)
            self._bind(NULL_CUPY)
            self.nccl, self.nccl_missing = _null_nccl(), None

    rt = NoDeviceRuntime()
    rows = []
    with use_runtime(rt):
        comm = Communicator(MPI.COMM_SELF)
        t = comm.transport_instance("nccl")  # its bootstrap talks over the real MPI duplicate
        null, real = NullMPI(), comm.mpi
        comm.mpi = null  # staged's host MPI calls do nothing either (its host transport binds it when made)
        staged = comm.transport_instance("staged")
        n = 256  # 1 KiB of float32 per rank, as rank 0 of 2
        x, r, g, big = (
            DeviceArray(n, np.float32),
            DeviceArray(n, np.float32),
            DeviceArray(2 * n, np.float32),
            DeviceArray(2 * n, np.float32),
        )
        hx = np.frombuffer(rt.alloc_pinned(x.nbytes), np.float32)
        hr = np.frombuffer(rt.alloc_pinned(x.nbytes), np.float32)
        env = dict(
            t=t,
            s=staged,
            nc=t.communicator,
            rt=rt,
            x=x,
            r=r,
            g=g,
            big=big,
            n=n,
            counts=[n, n],
            F32=t.nccl_datatype(np.float32),
            SUM=t.nccl_op("sum"),
            null=null,
            hx=hx,
            hr=hr,
            D=MPI.FLOAT,
            S=MPI.SUM,
            fixed=t.prepare("allreduce", (x, r, "sum")),  # what a plan of a 1 KiB all_reduce runs per call
            fixed_gather=t.prepare("allgatherv", (x, g, [n, n])),
            fixed_scatter=t.prepare("reduce_scatter", (big, r, [n, n], "sum")),
            staged_fixed=staged.prepare("allreduce", (x, r, "sum")),  # a plan's own pinned buffers
        )
        # the Plan a replayed all_reduce of x into r is (hpccoll.plan's result when its finishing step is Ready)
        env["planned"] = hpccoll.Plan(
            "all_reduce", r, ("blocking",), None, None, None, lambda: None, env["fixed"].steps
        )
        cases = [
            (
                "nccl allgatherv",
                "nc.allGather(rt.ptr(x), rt.ptr(g), n, F32, rt.stream())",
                "t.allgatherv(x, g, counts)",
            ),
            (
                "nccl reduce_scatter",
                "nc.reduceScatter(rt.ptr(big), rt.ptr(r), n, F32, SUM, rt.stream())",
                "t.reduce_scatter(big, r, counts, 'sum')",
            ),
            (
                "nccl allreduce",
                "nc.allReduce(rt.ptr(x), rt.ptr(r), n, F32, SUM, rt.stream())",
                "t.allreduce(x, r, 'sum')",
            ),
            (
                "nccl allreduce, in place",
                "nc.allReduce(rt.ptr(r), rt.ptr(r), n, F32, SUM, rt.stream())",
                "t.allreduce(None, r, 'sum')",
            ),
            (
                "nccl allreduce, planned",
                "nc.allReduce(rt.ptr(x), rt.ptr(r), n, F32, SUM, rt.stream())",
                "fixed.run()",
            ),
            (
                "nccl allreduce, Plan call",
                "nc.allReduce(rt.ptr(x), rt.ptr(r), n, F32, SUM, rt.stream())",
                "planned()",
            ),
            (
                "nccl allgatherv, planned",
                "nc.allGather(rt.ptr(x), rt.ptr(g), n, F32, rt.stream())",
                "fixed_gather.run()",
            ),
            (
                "nccl reduce_scatter, planned",
                "nc.reduceScatter(rt.ptr(big), rt.ptr(r), n, F32, SUM, rt.stream())",
                "fixed_scatter.run()",
            ),
            (
                "staged allreduce",
                "rt.to_host(x, hx); rt.sync_stream(); null.Allreduce([hx, D], [hr, D], S); rt.to_device(hr, r)",
                "s.allreduce(x, r, 'sum')",
            ),
            (
                "staged allreduce, planned",
                "rt.to_host(x, hx); rt.sync_stream(); null.Allreduce([hx, D], [hr, D], S); rt.to_device(hr, r)",
                "staged_fixed.run()",
            ),
        ]
        for name, raw_stmt, stmt in cases:
            rows.append((name,) + paired_ns(raw_stmt, stmt, env, number, repeat))
        comm.mpi = real
        comm.free()
    return rows


def print_gpu_section() -> None:
    print(
        "# GPU transports over a no-device CuPy runtime and a no-op NcclCommunicator (CPU time, best of 31 "
        "alternating repeats; 1 KiB float32 per rank): hpccoll's Python per call, target <= 1000 ns for nccl"
    )
    print(f"{'transport call':<28}{'raw (ns)':>10}{'hpccoll (ns)':>14}{'added (ns)':>12}")
    for name, t_raw, t in gpu_section():
        print(f"{name:<28}{t_raw:>10.0f}{t:>14.0f}{t - t_raw:>12.0f}")


LIST_CALLS = (
    ("list all_reduce of 256 arrays of 1 KiB", "{lib}.all_reduce(many, {comm})"),
    ("list all_gather of 256 arrays of 1 KiB", "{lib}.all_gather(many, {comm}, sizes=[128, 128])"),
    ("list reduce_scatter of 256 arrays of 1 KiB", "{lib}.reduce_scatter(many, {comm})"),
)


def print_lists_before(rev: str) -> None:
    """The list forms of ``rev`` (extracted as ``hpccoll_before``) and of the working tree, timed in alternation."""
    from bench_versions import load_before

    before = load_before(rev, MPI.COMM_SELF)
    comms = []
    for lib in (hpccoll, before):
        c = lib.Communicator(MPI.COMM_SELF, transport="mpi")
        c.size, c.mpi = 2, NullMPI()
        comms.append(c)
    many = [np.random.default_rng(i).standard_normal(128) for i in range(256)]
    env = dict(hpccoll=hpccoll, before=before, new=comms[0], old=comms[1], many=many)
    print(f"# list forms, {rev} vs the working tree: CPU time, best of 15 alternating repeats of 200 calls")
    print(f"{'call':<44}{rev + ' (us)':>12}{'now (us)':>10}{'now/' + rev:>14}")
    for name, stmt in LIST_CALLS:
        t_old, t_new = paired_ns(
            stmt.format(lib="before", comm="old"), stmt.format(lib="hpccoll", comm="new"), env, 200, 15
        )
        print(f"{name:<44}{t_old / 1e3:>12.1f}{t_new / 1e3:>10.1f}{t_new / t_old:>14.3f}")
    for c in comms:
        c.mpi, c._owned = MPI.COMM_SELF, False  # not ours to free: restore something Communicator.free can skip


def main() -> int:
    if "--gpu-only" in sys.argv[1:]:
        print_gpu_section()
        return 0
    if "--before" in sys.argv[1:]:  # python benchmarks/overhead.py --before REV: the list forms, paired
        print_lists_before(sys.argv[sys.argv.index("--before") + 1])
        return 0
    comm = Communicator(MPI.COMM_SELF, transport="mpi")  # host MPI: no transport probe over the null calls
    comm.size = 2  # as rank 0 of 2: the calls below move nothing, so no buffer needs the second half
    comm.mpi = null = NullMPI()
    x, out = np.ones(1), np.empty(1)
    big, gathered = np.ones(2), np.empty(2)
    many = [np.random.default_rng(i).standard_normal(128) for i in range(256)]
    env = dict(
        globals(), comm=comm, raw=null, x=x, out=out, big=big, gathered=gathered, many=many, D=MPI.DOUBLE, S=MPI.SUM
    )
    rows = [
        ("all_reduce, out=", "raw.Allreduce([x, D], [out, D], S)", "hpccoll.all_reduce(x, comm, out=out)"),
        ("all_reduce, allocating", "raw.Allreduce([x, D], [np.empty(1), D], S)", "hpccoll.all_reduce(x, comm)"),
        ("all_reduce, in place", "raw.Allreduce(MPI.IN_PLACE, [x, D], S)", "hpccoll.all_reduce(x, comm, out=x)"),
        (
            "all_gather, out=",
            "raw.Allgather([x, D], [gathered, D])",
            "hpccoll.all_gather(x, comm, sizes=[1, 1], out=gathered)",
        ),
        (
            "all_gather, allocating",
            "raw.Allgather([x, D], [np.empty(2), D])",
            "hpccoll.all_gather(x, comm, sizes=[1, 1])",
        ),
        (
            "reduce_scatter, out=",
            "raw.Reduce_scatter_block([big, D], [out, D], S)",
            "hpccoll.reduce_scatter(big, comm, out=out)",
        ),
        (
            "reduce_scatter, allocating",
            "raw.Reduce_scatter_block([big, D], [np.empty(1), D], S)",
            "hpccoll.reduce_scatter(big, comm)",
        ),
    ]
    print(
        f"# hpccoll {hpccoll.__version__}: Python cost per call against a null MPI communicator "
        f"(best of 7 repeats; Python {sys.version.split()[0]}, NumPy {np.__version__})"
    )
    print(f"{'call (1 float64)':<28}{'raw (ns)':>10}{'hpccoll (ns)':>14}{'added (ns)':>12}")
    for name, raw_stmt, stmt in rows:
        t_raw, t = best_ns(raw_stmt, env, 100_000), best_ns(stmt, env, 100_000)
        print(f"{name:<28}{t_raw:>10.0f}{t:>14.0f}{t - t_raw:>12.0f}")
    print()
    for name, stmt in LIST_CALLS:
        t_list = best_ns(stmt.format(lib="hpccoll", comm="comm"), env, 300)
        print(f"{name + ':':<44}{t_list / 1e3:>7.1f} us ({t_list / 256:.0f} ns per array)")
    print("(checks, packing into kept scratch buffers, one new result array, 256 views of it)")
    print()
    print_gpu_section()
    comm.mpi = MPI.COMM_SELF  # not ours to free: restore something Communicator.free can skip
    comm._owned = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
