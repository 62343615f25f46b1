"""CUDA-aware MPI detected, then declared: the sources in order, the variable's last word, one verdict for all ranks.

No GPU needed: the real detection runs on this machine's MPI, the sources are
faked by monkeypatching ``cuda_mpi``'s small source functions. Every test
makes its collective calls before its first check, and checks with
:func:`agree`, so a failure on one rank fails every rank.
"""

import warnings

import pytest
from conftest import agree
from mpi4py import MPI

import hpccoll
from hpccoll import _info
from hpccoll.transports import cuda_mpi
from hpccoll.transports.cuda_mpi import CudaAwareness, CudaMPI, cuda_aware

pytestmark = pytest.mark.mpi

SOURCES = ("_alloc_kinds", "_query_cuda_support", "_gpu_query_support")


@pytest.fixture
def fresh(comm, monkeypatch):
    """Fresh Communicators (the verdict is cached on each), the variable unset, the warning not yet given."""
    monkeypatch.delenv("HPCCOLL_CUDA_AWARE_MPI", raising=False)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    made = []

    def new():
        made.append(hpccoll.Communicator(comm.mpi))
        return made[-1]

    yield new
    for c in reversed(made):
        c.free()


def fake_sources(monkeypatch, answers):
    """Replace the three sources by fakes giving ``answers`` (None: no answer; an exception: raised); returns
    the list of the sources asked, in order."""
    asked = []
    for name, answer in zip(SOURCES, answers):

        def fake(comm, name=name, answer=answer):
            asked.append(name)
            if isinstance(answer, Exception):
                raise answer
            return answer

        monkeypatch.setattr(cuda_mpi, name, fake)
    return asked


def test_real_detection_answers_alike_on_every_rank(fresh):
    c = fresh()
    found = cuda_aware(c)
    everyone = c.mpi.allgather(found)
    kinds = c.mpi.Get_info()
    listed = kinds.Get("mpi_memory_alloc_kinds")
    kinds.Free()
    agree(c, all(f == everyone[0] for f in everyone), f"ranks answered {everyone}")
    agree(c, found.aware is not None and found.source != "no source answered", f"no definite answer: {found}")
    if listed is not None:  # an MPI-4.1 library (MPICH 5: 'mpi,system'): its info key answers first
        want = CudaAwareness("cuda:device" in listed.split(",") or "cuda" in listed.split(","), "")
        agree(c, found == want._replace(source=f"mpi_memory_alloc_kinds={listed!r}"), f"got {found}")
    if MPI.Get_library_version().startswith("MPICH") and MPI.Get_version() >= (5, 0):
        agree(c, found.source.startswith("mpi_memory_alloc_kinds="), f"MPICH 5 answered through {found.source}")


@pytest.mark.parametrize("value,aware", [("1", True), ("0", False), (" Yes", True), ("off", False)])
def test_the_variable_has_the_last_word(fresh, monkeypatch, value, aware):
    fake_sources(monkeypatch, [(not aware, "mpi_memory_alloc_kinds='faked'"), None, None])
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", value)
    c = fresh()
    found = cuda_aware(c)
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "0" if aware else "1")
    cached = cuda_aware(c)
    again = cuda_aware(fresh())
    want = CudaAwareness(aware, f"HPCCOLL_CUDA_AWARE_MPI={int(aware)}")
    agree(c, found == want and cached == want, f"got {found}, then {cached}")
    agree(c, again == CudaAwareness(not aware, f"HPCCOLL_CUDA_AWARE_MPI={int(not aware)}"), f"got {again}")


@pytest.mark.parametrize(
    "answers,asked,want",
    [
        (
            [(False, "mpi_memory_alloc_kinds='mpi,system'"), (True, "x"), (True, "y")],
            SOURCES[:1],
            CudaAwareness(False, "mpi_memory_alloc_kinds='mpi,system'"),
        ),
        (
            [None, (True, "MPIX_Query_cuda_support()=1"), (False, "y")],
            SOURCES[:2],
            CudaAwareness(True, "MPIX_Query_cuda_support()=1"),
        ),
        (
            [OSError("no info"), RuntimeError("ctypes"), (True, "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)=1")],
            SOURCES,
            CudaAwareness(True, "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)=1"),
        ),
        ([None, None, None], SOURCES, CudaAwareness(None, "no source answered")),
    ],
    ids=["info-first", "then-open-mpi", "then-mpich-after-failures", "none"],
)
def test_sources_in_order(fresh, monkeypatch, answers, asked, want):
    order = fake_sources(monkeypatch, answers)
    c = fresh()
    found = cuda_aware(c)
    agree(c, found == want and tuple(order) == asked, f"got {found} after asking {order}")


YES = (True, "mpi_memory_alloc_kinds='mpi,system,cuda:device'")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "rank0,others", [(YES, (False, "MPIX_Query_cuda_support()=0")), (None, YES)], ids=["yes-no", "none-yes"]
)
def test_a_yes_on_some_ranks_is_a_no_on_all(comm, fresh, monkeypatch, rank0, others):
    fake_sources(monkeypatch, [rank0 if comm.rank == 0 else others, None, None])
    c = fresh()
    found = cuda_aware(c)
    auto = CudaMPI.auto_reason(c)
    everyone = c.mpi.allgather((found, auto))
    agree(c, all(f == everyone[0] for f in everyone), f"ranks answered {everyone}")
    agree(c, found.aware is False and found.source.startswith("ranks disagree (rank 0: "), f"got {found}")
    agree(c, auto == f"not CUDA-aware ({found.source})", f"auto_reason {auto!r}")


def test_missing_symbols_and_failures_never_raise(fresh, monkeypatch):
    c = fresh()
    missing = cuda_mpi._mpi_function("MPIX_no_such_function")
    present = cuda_mpi._mpi_function("MPI_Init")
    lookup = cuda_mpi._mpi_function
    monkeypatch.setattr(cuda_mpi, "_mpi_function", lambda name: None)
    symbols = [cuda_mpi._query_cuda_support(c), cuda_mpi._gpu_query_support(c)]

    def refused(*args, **kwargs):
        raise OSError("dlopen refused")

    monkeypatch.setattr(cuda_mpi, "_mpi_function", lookup)
    monkeypatch.setattr(cuda_mpi.ctypes, "CDLL", refused)
    monkeypatch.setattr(cuda_mpi, "_alloc_kinds", lambda comm: None)
    refusal = cuda_mpi._mpi_function("MPIX_Query_cuda_support")
    found = cuda_aware(fresh())
    agree(c, missing is None and present is not None, f"lookup: {missing}, {present}")
    agree(c, symbols == [None, None], f"without the symbols: {symbols}")
    agree(c, refusal is None and found == CudaAwareness(None, "no source answered"), f"dlopen refused: {found}")


@pytest.mark.parametrize("answered", [False, True])
def test_warned_only_when_no_source_answered(fresh, monkeypatch, answered):
    fake_sources(monkeypatch, [(False, "mpi_memory_alloc_kinds='mpi,system'") if answered else None, None, None])
    c = fresh()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        reason = CudaMPI.auto_reason(c)
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    if answered:
        agree(c, reason == "not CUDA-aware (mpi_memory_alloc_kinds='mpi,system')" and not said, f"{reason}, {said}")
    else:
        want = "CUDA-awareness unknown (no source answered; HPCCOLL_CUDA_AWARE_MPI is unset)"
        agree(c, reason == want and len(said) == 1 and "is not set" in said[0], f"{reason}, {said}")


def test_reasons_name_the_source(fresh, monkeypatch):
    fake_sources(monkeypatch, [(True, "mpi_memory_alloc_kinds='mpi,cuda'"), None, None])
    c = fresh()
    chosen = CudaMPI.chosen_for(c)
    report = _info.report(_info.collect(c))
    monkeypatch.setenv("HPCCOLL_CUDA_AWARE_MPI", "0")
    refused = CudaMPI.unavailable_reason(fresh())
    agree(c, chosen == "this MPI is CUDA-aware (mpi_memory_alloc_kinds='mpi,cuda')", chosen)
    agree(c, "CUDA-aware: yes (mpi_memory_alloc_kinds='mpi,cuda')" in report, report)
    agree(c, refused == "HPCCOLL_CUDA_AWARE_MPI=0 declares this MPI not CUDA-aware", refused)
