"""Transport selection by capability: register() after import, priority order, size thresholds, one road."""

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import hpccoll
from hpccoll import transports
from hpccoll.transports.host_mpi import HostMPI

pytestmark = pytest.mark.mpi


class Recording(HostMPI):
    """Host MPI that records which primitive it ran (the probe: usable everywhere)."""

    name = "recording"
    priority = 10  # before mpi
    chosen_because = "a recording transport"
    min_bytes = 1024
    calls: list = []

    def allgatherv(self, send, recv, counts):
        Recording.calls.append("allgatherv")
        super().allgatherv(send, recv, counts)

    def reduce_scatter(self, send, recv, counts, op):
        Recording.calls.append("reduce_scatter")
        super().reduce_scatter(send, recv, counts, op)

    def allreduce(self, send, recv, op):
        Recording.calls.append("allreduce")
        super().allreduce(send, recv, op)


@pytest.fixture
def recording(comm, monkeypatch):
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)  # auto's choices, whatever the run named
    Recording.calls = []
    transports.register(Recording)
    made = []

    def new(**kwargs):
        made.append(hpccoll.Communicator(comm.mpi, **kwargs))
        return made[-1]

    try:
        yield new
    finally:
        for c in made:
            c.free()
        transports.unregister("recording")


def test_register_after_import_and_auto_by_size(recording):
    c = recording()
    assert "recording" in transports.TRANSPORTS and hpccoll.TRANSPORTS == transports.TRANSPORTS
    choice = c.transport_for(np.zeros(2))
    assert choice.name == "mpi" and "a recording transport, for messages of >= 1024 bytes" in choice.reason
    chain = transports.transport_chain(c, "numpy")  # shm may sit between them (ranks sharing one node)
    assert chain[0] == (1024, "recording") and chain[-1] == (0, "mpi") and len(chain) <= 3
    small, large = np.ones(4), np.ones(256)  # 32 B and 2 KiB: below and above the threshold
    got = [
        hpccoll.all_reduce(small, c),
        hpccoll.all_reduce(large, c),
        hpccoll.reduce_scatter(np.ones(128 * c.size), c),
        hpccoll.all_gather(np.ones(128), c),
        hpccoll.all_reduce([large, large], c),
        hpccoll.all_reduce(large, c, async_op=True).wait(),
    ]
    # every path, the common branch, the general one, lists and async, reached the chosen transport
    expected = [] if c.size == 1 else ["allreduce", "reduce_scatter", "allgatherv", "allreduce"]
    assert Recording.calls == expected
    np.testing.assert_array_equal(got[1], np.full(256, c.size))
    np.testing.assert_array_equal(got[3], np.ones(128 * c.size))


def test_named_transport_and_unregister(recording, comm):
    c = recording(transport="recording")
    assert c.transport_for(np.zeros(1)) == ("recording", "transport='recording' requested")
    hpccoll.all_reduce(np.ones(1), c)
    assert Recording.calls == ([] if c.size == 1 else ["allreduce"])
    transports.unregister("recording")
    assert "recording" not in transports.TRANSPORTS and "recording" not in hpccoll.TRANSPORTS
    with pytest.raises(hpccoll.ArgumentError, match="transport: expected one of"):
        hpccoll.Communicator(comm.mpi, transport="recording")
    transports.register(Recording)  # the fixture unregisters it again


def test_auto_order_is_priority_then_registration():
    order = [cls.name for cls in transports.transport_classes()]
    assert order.index("nccl") < order.index("cuda_mpi") < order.index("staged")
    assert all(
        a.priority <= b.priority for a, b in zip(transports.transport_classes(), transports.transport_classes()[1:])
    )


class Nonblocking(hpccoll.transports.Transport):
    """A transport written outside the tree with only the non-blocking forms of the four data primitives (over
    mpi4py's I-calls): its blocking forms are their wait(), and the contract's other defaults build on those."""

    name = "nonblocking"
    array_kind = "numpy"
    priority = 90
    calls: list = []

    def _call(self, name, *args):
        Nonblocking.calls.append(name)
        req = getattr(self.comm.mpi, name)(*args)

        class Waiting:
            def wait(self):
                req.Wait()

            def test(self):
                return req.Test()

        return Waiting()

    def iallgatherv(self, send, recv, counts):
        return self._call("Iallgatherv", MPI.IN_PLACE if send is None else send, [recv, (list(counts), None)])

    def ireduce_scatter(self, send, recv, counts, op):
        assert op == "sum"
        return self._call("Ireduce_scatter", MPI.IN_PLACE if send is None else send, recv, list(counts))

    def iallreduce(self, send, recv, op):
        assert op == "sum"
        return self._call("Iallreduce", MPI.IN_PLACE if send is None else send, recv)

    def ialltoallv(self, send, recv, send_counts, recv_counts, even=False):
        return self._call("Ialltoallv", [send, (list(send_counts), None)], [recv, (list(recv_counts), None)])


def test_a_transport_of_non_blocking_forms_only(comm):
    """The blocking forms default to the non-blocking ones' wait() where only those are written; the rooted
    collectives, the halo's sendrecv and shift run on the contract's defaults built on them."""
    transports.register(Nonblocking)
    c = hpccoll.Communicator(comm.mpi, transport="nonblocking")
    try:
        P, r = c.size, c.rank
        agree(c, Nonblocking.allreduce is not hpccoll.transports.Transport.allreduce)
        x = np.arange(4.0) + r
        got = hpccoll.all_reduce(x, c)
        agree(c, np.array_equal(got, sum(np.arange(4.0) + q for q in range(P))), str(got))
        got = hpccoll.all_gather(x, c)
        agree(c, np.array_equal(got, np.concatenate([np.arange(4.0) + q for q in range(P)])), str(got))
        got = hpccoll.broadcast(x, c, root=P - 1)
        agree(c, np.array_equal(got, np.arange(4.0) + P - 1), str(got))
        got = hpccoll.shift(x, c)
        agree(c, np.array_equal(got, np.arange(4.0) + (r - 1) % P), str(got))
        if P > 1:
            agree(c, {"Iallreduce", "Iallgatherv", "Ialltoallv"} <= set(Nonblocking.calls), str(Nonblocking.calls))
    finally:
        c.free()
        transports.unregister("nonblocking")
        Nonblocking.calls = []


def test_a_transport_without_either_form_is_abstract():
    class Neither(hpccoll.transports.Transport):
        name = "neither"
        array_kind = "numpy"

    with pytest.raises(TypeError, match="abstract"):
        Neither(None)


class Relay(HostMPI):
    """A transport written outside the tree that composes host MPI for what it does not win: it declares its
    hand-offs (``wins``, ``leaves``) and its primitives never hand a message on themselves."""

    name = "relay"
    priority = 10  # before shm and mpi
    chosen_because = "a relaying transport"
    min_bytes = 1024
    wins = {"allreduce": (1024, 1 << 20)}
    first_use = False  # the table is the verdict (no race)
    hosts = False  # not a host transport for others: host MPI is its own
    calls: list = []

    def __init__(self, comm):
        super().__init__(comm)
        self.host = comm.host_transport()

    def leaves(self, primitive, blocking):
        return not blocking  # its non-blocking forms are host MPI's

    def allreduce(self, send, recv, op):
        Relay.calls.append(("allreduce", recv.nbytes))
        super().allreduce(send, recv, op)

    def iallreduce(self, send, recv, op):
        Relay.calls.append(("iallreduce", recv.nbytes))
        return super().iallreduce(send, recv, op)

    def reduce_scatter(self, send, recv, counts, op):
        Relay.calls.append(("reduce_scatter", recv.nbytes))
        super().reduce_scatter(send, recv, counts, op)


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
def test_the_selector_reads_a_transports_declared_hand_offs(comm, named, monkeypatch):
    """The communicator's selector gives a composing transport the calls it declares it wins (all of them,
    but what it ``leaves``, where it was named) and host MPI every other; explain names the same mover."""
    monkeypatch.delenv("HPCCOLL_TRANSPORT", raising=False)
    transports.register(Relay)
    Relay.calls = []
    c = hpccoll.Communicator(comm.mpi, transport="relay" if named else "auto")
    try:
        P = c.size
        sizes = (32, 2048, 2 << 20)  # below min_bytes, inside wins, past wins
        for nbytes in sizes:
            x = np.ones(nbytes // 8)
            agree(c, np.array_equal(hpccoll.all_reduce(x, c), x * P))
            agree(c, np.array_equal(hpccoll.all_reduce(x, c, async_op=True).wait(), x * P))
            agree(c, np.array_equal(hpccoll.reduce_scatter(np.ones(nbytes // 8 * P), c), x * P))
            want = "relay" if named or nbytes == 2048 else "mpi"
            agree(c, c.explain(x).moved_by == (want,) or P == 1, f"{nbytes} B: {c.explain(x)}")
            agree(c, c.transport_of("numpy", nbytes, "allreduce", blocking=False).name == "mpi")
        if named:
            expected = [(p, n) for n in sizes for p in ("allreduce", "reduce_scatter")]
        else:
            expected = [("allreduce", 2048)]
        agree(c, Relay.calls == ([] if P == 1 else expected), str(Relay.calls))
    finally:
        c.free()
        transports.unregister("relay")
        Relay.calls = []
