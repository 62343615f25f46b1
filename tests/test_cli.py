"""`python -m hpccoll --version | info | bench` and the shared timer: run in-process at the suite's rank count.

The bench tests parse the table (data rows are the lines not starting with '#')
and check each nccl-tests flag's meaning by its effect: ``-c`` on how often the
results are checked, ``-z`` on the ``async_op`` the collectives get, ``-r`` on
what is refused and on the root the rooted collectives get (and are checked
against), ``--list`` on the arrays a call gets.
"""

import json
import pathlib
import subprocess
import sys
import time

import pytest
import standin_cupy
from conftest import agree
from launch import run_mpiexec
from mpi4py import MPI
from standin_nccl import StandInRuntime

import hpccoll
from hpccoll import _bench, _timing
from hpccoll.__main__ import main
from hpccoll.transports import _cuda, cuda_mpi
from hpccoll.transports import nccl as nccl_mod

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
SMALL = ["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "--rounds", "1"]  # sizes 8 B, 64 B, 512 B, 4 KiB
ROOTED = ("broadcast", "reduce", "gather", "scatter")
NO_IN_PLACE = ("alltoall", "gather", "scatter")  # out may not overlap x
#: the hpccoll function each bench collective times
FUNCTIONS = {
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "allreduce": "all_reduce",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "shift": "shift",
    "permute": "permute",
}


def rows_of(text):
    """The data rows of a bench table: every line not starting with '#'."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def table_of(text):
    """``(collective, row)`` for every data row, the collective from the section header above it."""
    found, coll = [], None
    for line in text.splitlines():
        if line.startswith("# ") and ": " in line and line[2:].split(":")[0] in FUNCTIONS:
            coll = line[2:].split(":")[0]
        elif line.strip() and not line.startswith("#"):
            found.append((coll, line.split()))
    return found


def bench(capsys, *args):
    """Run ``bench`` with ``args``; (status, stdout, stderr) on this rank."""
    status = main(["bench", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


class Calls:
    """Wraps ``hpccoll.<name>`` and records, per call, ``x``, the ``async_op`` and the ``root`` it got.

    ``root``, if given, replaces the root the call asked for (a bench that ignored ``-r``).
    """

    def __init__(self, monkeypatch, name, corrupt=False, root=None):
        self.seen = []
        self.roots = []
        real = getattr(hpccoll, name)

        def wrapped(x, *args, **kwargs):
            self.seen.append((x, kwargs.get("async_op", False)))
            self.roots.append(kwargs.get("root"))
            if root is not None:
                kwargs["root"] = root
            result = real(x, *args, **kwargs)
            first = result[0] if isinstance(result, list) else result
            if corrupt and first.size:  # one wrong element in every non-empty result (the first array of a list)
                first.reshape(-1)[0] += 1
            return result

        monkeypatch.setattr(hpccoll, name, wrapped)


# --------------------------------------------------------------------------- top level


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hpccoll {hpccoll.__version__}\n"


@pytest.mark.skipif(WORLD.size > 1, reason="starts its own interpreter; runs in the serial suite")
def test_version_and_no_command_from_the_shell():
    proc = subprocess.run([sys.executable, "-m", "hpccoll", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == f"hpccoll {hpccoll.__version__}\n"
    proc = subprocess.run([sys.executable, "-m", "hpccoll"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "usage:" in proc.stdout and "bench" in proc.stdout


def test_help_lists_the_subcommands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "--version" in out
    assert any(line.split()[:1] == ["info"] and "report" in line for line in out.splitlines()), out
    assert any(line.split()[:1] == ["bench"] and "bandwidth" in line for line in out.splitlines()), out
    assert main([]) == 2 and "usage:" in capsys.readouterr().out  # no command: the help, status 2
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'frobnicate'" in err and "'info', 'bench'" in err


def test_bench_help_says_what_differs_from_nccl_tests(capsys):
    assert main(["bench", "-h"]) == 0
    out = capsys.readouterr().out
    assert "what differs from nccl-tests" in out
    for flag in ("-b", "-e", "-f", "-n", "-w", "-c", "-d", "-o", "-r", "-z", "--collective", "--rounds", "--list"):
        assert f"  {flag}" in out, flag
    assert "alltoall" in out and "--device {numpy,cupy}" in out


def test_bad_arguments_exit_2_with_the_reason(capsys):
    for args, reason in (
        (["-d", "float128"], "expected a dtype"),
        (["-b", "lots"], "expected a size"),
        (["-c", "-1"], "expected an int >= 0"),
        (["-z", "2"], "expected 0 or 1"),
        (["--list", "x"], "expected an int >= 0"),
        (["--rounds", "0"], "expected an int >= 1"),
        (["-b", "64", "-e", "8"], "expected 1 <= minbytes <= maxbytes"),
        (["--collective", "sendrecv"], "invalid choice: 'sendrecv'"),
    ):
        status, out, err = bench(capsys, *args)
        assert status == 2 and reason in err, (args, err)
        assert rows_of(out) == []


# --------------------------------------------------------------------------- the table


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--uneven", "--axis", "1"],
        ["-d", "float16", "-o", "avg"],
        ["-d", "bool", "-o", "max"],
        ["-d", "int64", "-o", "prod", "--baseline"],
        ["--uneven", "-z", "0", "--baseline"],
    ],
)
def test_bench_table(capsys, extra):
    status, out, _ = bench(capsys, *SMALL, *extra)
    assert status == 0
    if WORLD.rank != 0:
        assert out == ""
        return
    rows = table_of(out)
    assert len(rows) == len(FUNCTIONS) * 4  # every collective (the rooted ones too), sizes 8 B, 64 B, 512 B, 4 KiB
    assert [c for c, _ in rows] == [c for c in _bench.collectives() for _ in range(4)]
    assert set(_bench.collectives()) == set(FUNCTIONS) and set(_bench.ROOTED) == set(ROOTED)
    width = 5 + 8 + (2 if "--baseline" in extra else 0)
    for coll, row in rows:
        assert len(row) == width, row
        assert row[8] == "0", f"out-of-place #wrong must be 0: {coll} {row}"
        assert float(row[5]) > 0
        assert row[4] == ("0" if coll in ROOTED else "-1"), (coll, row)  # -r defaults to 0
        if coll in ("allgather", "alltoall", "broadcast", "gather", "scatter"):
            assert row[3] == "none", (coll, row)
        if "--baseline" in extra:  # raw MPI has every one of these calls: its time and the ratio
            assert float(row[13]) > 0 and float(row[14]) > 0, (coll, row)
        if coll in NO_IN_PLACE:
            assert row[9:13] == ["n/a"] * 4, (coll, row)
        else:
            assert row[12] == "0" and float(row[9]) > 0, (coll, row)
    assert "# Out of bounds values : 0 OK" in out
    assert "# Avg bus bandwidth" in out


def test_bench_baseline_moves_bfloat16_as_its_bits(capsys):
    """Raw MPI has no bfloat16: the data-movement rows time it on the bits (uint16), the sums have no raw call."""
    pytest.importorskip("ml_dtypes")
    status, out, _ = bench(capsys, *SMALL, "-d", "bfloat16", "--baseline")
    assert status == 0
    if WORLD.rank != 0:
        return
    for coll, row in table_of(out):
        assert row[8] == "0", (coll, row)
        if row[3] == "none":  # data movement
            assert float(row[13]) > 0 and float(row[14]) > 0, (coll, row)
        else:
            assert row[13:] == ["n/a", "-"], (coll, row)


def test_bench_json_and_bus_bandwidth(tmp_path, capsys):
    n = WORLD.size
    root = n - 1
    path = WORLD.bcast(str(tmp_path / "bench.json"))
    for coll, factor in (
        ("allreduce", 2 * (n - 1) / n),
        ("alltoall", (n - 1) / n),
        ("broadcast", 1.0),  # nccl-tests: busbw = algbw for broadcast and reduce
        ("reduce", 1.0),
        ("gather", (n - 1) / n),
        ("scatter", (n - 1) / n),
    ):
        status, _, _ = bench(
            capsys, "--collective", coll, "-b", "1K", "-e", "1K", "-n", "2", "--rounds", "1", "-r", str(root),
            "--json", path,
        )  # fmt: skip
        assert status == 0
        WORLD.Barrier()
        data = json.loads(pathlib.Path(path).read_text())
        WORLD.Barrier()  # every rank has read it before rank 0 writes the next
        (row,) = data["rows"]
        assert data["ranks"] == n and row["collective"] == coll
        assert row["root"] == (root if coll in ROOTED else -1), row
        # the whole array (all-reduce, broadcast, reduce), else whole blocks of one per rank (one rank's send
        # buffer of all-to-all, the gathered output of gather, root's input of scatter)
        count = 256 if coll in ("allreduce", "broadcast", "reduce") else 256 // n * n
        assert row["count"] == count and row["size"] == 4 * count
        assert row["redop"] == ("sum" if coll in ("allreduce", "reduce") else "none")
        assert row["oop"]["busbw"] == pytest.approx(row["oop"]["algbw"] * factor)
        assert row["oop"]["algbw"] == pytest.approx(row["size"] / 1e9 / (row["oop"]["time_us"] / 1e6))
        assert row["oop"]["wrong"] == 0
        assert (row["ip"] is None) == (coll in NO_IN_PLACE)


@pytest.mark.parametrize("extra", [[], ["--uneven", "--axis", "1"], ["--uneven", "--list", "2"]])
def test_alltoall_rows_are_checked(monkeypatch, capsys, extra):
    status, out, _ = bench(capsys, "--collective", "alltoall", *SMALL, *extra)
    assert status == 0
    if WORLD.rank == 0:
        assert [r[8] for r in rows_of(out)] == ["0"] * 4 and "# Out of bounds values : 0 OK" in out
    Calls(monkeypatch, "all_to_all", corrupt=True)  # the check must see a wrong element
    status, out, _ = bench(capsys, "--collective", "alltoall", *SMALL, *extra)
    assert status == 1
    if WORLD.rank == 0:
        assert all(int(r[8]) >= 1 for r in rows_of(out)), out  # one per rank with a non-empty result
        assert "FAILED" in out


@pytest.mark.parametrize("extra", [[], ["--uneven", "--axis", "1"], ["--uneven", "--list", "2"], ["-r", "last"]])
@pytest.mark.parametrize("coll", ROOTED)
def test_rooted_rows_are_checked(monkeypatch, capsys, coll, extra):
    extra = [str(WORLD.size - 1) if a == "last" else a for a in extra]
    status, out, _ = bench(capsys, "--collective", coll, *SMALL, *extra)
    assert status == 0
    if WORLD.rank == 0:
        rows = rows_of(out)
        assert [r[8] for r in rows] == ["0"] * 4 and "# Out of bounds values : 0 OK" in out
        assert [r[12] for r in rows] == (["n/a"] * 4 if coll in NO_IN_PLACE else ["0"] * 4), out
    Calls(monkeypatch, coll, corrupt=True)  # the check must see a wrong element (root's, at least)
    status, out, _ = bench(capsys, "--collective", coll, *SMALL, *extra)
    assert status == 1
    if WORLD.rank == 0:
        assert all(int(r[8]) >= 1 for r in rows_of(out)), out
        assert "FAILED" in out


@pytest.mark.parametrize(
    "name,coll,ranks",  # ranks: how many ranks' results are checked (every element of each is wrong)
    [
        ("all_gather", "allgather", "all"),
        ("all_to_all", "alltoall", "all"),
        ("broadcast", "broadcast", "all"),
        ("scatter", "scatter", "all"),  # every rank's block: count over all ranks together
        ("reduce", "reduce", "root"),
        ("gather", "gather", "root"),
    ],
)
def test_check_sees_a_result_never_written(monkeypatch, capsys, name, coll, ranks):
    monkeypatch.setattr(hpccoll, name, lambda x, comm=None, **kw: kw["out"])  # moves nothing, returns out
    status, out, _ = bench(capsys, "--collective", coll, "-b", "64", "-e", "64", "-n", "1", "--rounds", "1")
    assert status == 1
    if WORLD.rank == 0:
        (row,) = rows_of(out)
        if coll == "scatter":
            want = int(row[1])  # the blocks of root's array, one per rank
        else:
            want = int(row[1]) * (WORLD.size if ranks == "all" else 1)
        assert int(row[8]) == want, row
        assert "FAILED" in out
        # in place (out=x): root's x is already its broadcast; its reduction only at one rank
        if coll == "broadcast":
            assert int(row[12]) == int(row[1]) * (WORLD.size - 1), row
        if coll == "reduce":
            assert int(row[12]) == (int(row[1]) if WORLD.size > 1 else 0), row


def test_check_flag_counts_checked_calls(monkeypatch, capsys):
    checked = []
    real = _bench._wrong
    monkeypatch.setattr(_bench, "_wrong", lambda got, want: checked.append(1) or real(got, want))
    one_size = ["--collective", "allreduce", "-b", "64", "-e", "64", "-n", "2", "--rounds", "1"]
    status, out, _ = bench(capsys, *one_size, "-c", "0")
    assert status == 0 and checked == []  # -c 0: nothing checked
    if WORLD.rank == 0:
        (row,) = rows_of(out)
        assert row[8] == "N/A" and row[12] == "N/A"
        assert "# Out of bounds values : N/A (not checked: -c 0)" in out
    status, out, _ = bench(capsys, *one_size, "-c", "3")
    assert status == 0 and len(checked) == 3 * 2  # 3 checked calls, out-of-place and in place
    if WORLD.rank == 0:
        (row,) = rows_of(out)
        assert row[8] == "0" and row[12] == "0"


@pytest.mark.parametrize("coll", ROOTED)
def test_check_flag_on_the_rooted_rows(monkeypatch, capsys, coll):
    root = WORLD.size - 1
    checked = []
    real = _bench._wrong
    monkeypatch.setattr(_bench, "_wrong", lambda got, want: checked.append(1) or real(got, want))
    calls = Calls(monkeypatch, coll)
    one_size = ["--collective", coll, "-b", "64", "-e", "64", "-n", "2", "--rounds", "1", "-r", str(root)]
    status, out, _ = bench(capsys, *one_size, "-c", "0")
    assert status == 0 and checked == []
    if WORLD.rank == 0:
        (row,) = rows_of(out)
        assert row[8] == "N/A" and row[12] == ("n/a" if coll in NO_IN_PLACE else "N/A")
    before = len(calls.seen)
    status, out, _ = bench(capsys, *one_size, "-c", "3")
    assert status == 0
    forms = 1 if coll in NO_IN_PLACE else 2
    assert len(calls.seen) - before >= 3 * forms  # every rank makes every checked call
    mine = 0 if coll in ("reduce", "gather") and WORLD.rank != root else 3 * forms  # reduce, gather: root's alone
    assert len(checked) == mine
    if WORLD.rank == 0:
        (row,) = rows_of(out)
        assert row[8] == "0"


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_blocking_flag_picks_async_op(monkeypatch, capsys, blocking):
    calls = {name: Calls(monkeypatch, name) for name in FUNCTIONS.values()}
    status, out, _ = bench(capsys, *SMALL, "-z", blocking)
    assert status == 0
    for name, c in calls.items():
        assert c.seen, name
        assert {a for _, a in c.seen} == {blocking == "0"}, name  # -z 0: every call async_op=True
    if WORLD.rank == 0:
        assert all(r[8] == "0" for r in rows_of(out)) and f"blocking: {blocking}" in out


def test_root_flag_is_checked_against_the_ranks(capsys):
    n = WORLD.size
    for bad in (n, -1):
        status, out, err = bench(capsys, *SMALL, "-r", str(bad))
        assert status == 2 and rows_of(out) == []
        assert f"argument -r/--root: expected a rank in [0, {n}); got {bad}" in err
    for coll in ROOTED:  # refused for a rooted collective alone too, before anything is measured
        status, out, err = bench(capsys, "--collective", coll, "-r", str(n))
        assert status == 2 and rows_of(out) == [] and "argument -r/--root: expected a rank in [0," in err
    status, out, _ = bench(capsys, "--collective", "allreduce", "-b", "8", "-e", "8", "-r", str(n - 1), "--rounds", "1")
    assert status == 0
    if WORLD.rank == 0:
        assert f"# root {n - 1}: of the rooted collectives (broadcast, reduce, gather, scatter)" in out
        assert [r[4] for r in rows_of(out)] == ["-1"]  # all-reduce has no root


def test_root_flag_is_honoured(monkeypatch, capsys):
    n = WORLD.size
    root = n - 1
    calls = {coll: Calls(monkeypatch, coll) for coll in ROOTED}
    status, out, _ = bench(capsys, *SMALL, "-r", str(root), "--baseline")
    assert status == 0
    for coll, c in calls.items():
        assert c.roots and set(c.roots) == {root}, coll  # every call, timed and checked, got -r
    if WORLD.rank == 0:
        rows = table_of(out)
        assert len(rows) == len(FUNCTIONS) * 4 and all(r[8] == "0" for _, r in rows), out
        assert [r[4] for _, r in rows] == [str(root) if c in ROOTED else "-1" for c, _ in rows]
        assert all(f"# {c}: {n} ranks, root {root}," in out for c in ROOTED), out


@pytest.mark.parametrize("coll", ["broadcast", "reduce"])  # gather's and scatter's buffers differ at root
def test_a_call_that_ignores_the_root_is_counted_wrong(monkeypatch, capsys, coll):
    n = WORLD.size
    Calls(monkeypatch, coll, root=0)  # every call runs at root 0 whatever -r says
    status, out, _ = bench(capsys, "--collective", coll, *SMALL, "-r", str(n - 1))
    assert status == (1 if n > 1 else 0)  # at one rank, root 0 is the only root
    if WORLD.rank == 0:
        rows = rows_of(out)
        assert all((int(r[8]) >= 1) == (n > 1) for r in rows), out


def test_list_form(monkeypatch, capsys):
    calls = {name: Calls(monkeypatch, name) for name in FUNCTIONS.values()}
    status, out, _ = bench(capsys, *SMALL, "--list", "3")
    assert status == 0
    for name, c in calls.items():
        assert c.seen and all(isinstance(x, list) and len(x) == 3 for x, _ in c.seen), name
    if WORLD.rank != 0:
        return
    rows = table_of(out)
    assert len(rows) == len(FUNCTIONS) * 4 and "arrays per call: 3 (list form)" in out
    for coll, row in rows:
        assert row[8] == "0", (coll, row)
        in_place = coll in ("allreduce", "broadcast", "reduce", "shift", "permute")  # list forms with out=x
        assert (row[12] == "0") if in_place else (row[9:13] == ["n/a"] * 4), (coll, row)
        assert int(row[1]) % 3 == 0  # the count is split among 3 arrays of one size


# --------------------------------------------------------------------------- checked before measuring


def no_measuring(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("measured although the run could not finish")

    monkeypatch.setattr(_timing, "interleave", refuse)


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch, capsys, tmp_path):
    no_measuring(monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    start = time.perf_counter()
    status, out, err = bench(capsys, *SMALL, "--plot", str(tmp_path / "b.png"))
    assert status == 2 and rows_of(out) == []
    assert "--plot: expected matplotlib to import" in err and "hpccoll[plot]" in err
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "b.png").exists()


@pytest.mark.parametrize("coll", ["alltoall", "gather"])
def test_plot_draws(capsys, tmp_path, coll):
    pytest.importorskip("matplotlib")
    path = WORLD.bcast(str(tmp_path / "b.png"))
    status, _, _ = bench(
        capsys, "--collective", coll, "-b", "8", "-e", "64", "--rounds", "1", "--baseline", "--plot", path
    )
    assert status == 0
    WORLD.Barrier()
    assert pathlib.Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_device_cupy_without_cupy_fails_before_measuring(monkeypatch, capsys):
    no_measuring(monkeypatch)
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(_cuda, "_RUNTIME", None)
    status, out, err = bench(capsys, *SMALL, "--device", "cupy")
    assert status == 2 and rows_of(out) == []
    assert "--device cupy: expected CuPy and a GPU; got TransportUnavailable" in err


@pytest.fixture
def standin_gpu(monkeypatch):
    """The CuPy stand-in installed as ``cupy``, with its NCCL, the caller on a non-blocking stream."""
    for name in ("HPCCOLL_CUDA_AWARE_MPI", "HPCCOLL_NCCL_UNEVEN", "HPCCOLL_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nccl_mod, "_CHOSEN", None)
    monkeypatch.setattr(cuda_mpi, "_warned", False)
    monkeypatch.setitem(sys.modules, "cupy", standin_cupy)
    with _cuda.use_runtime(StandInRuntime()), standin_cupy.cuda.Stream(non_blocking=True):
        yield
        standin_cupy.GPU.synchronize()


@pytest.mark.parametrize("extra", [[], ["-z", "0", "--uneven", "--list", "2"]])
def test_device_cupy_on_the_gpu_standin(monkeypatch, capsys, standin_gpu, extra):
    calls = [Calls(monkeypatch, name) for name in ("all_reduce", *ROOTED)]
    status, out, _ = bench(capsys, *SMALL, "--device", "cupy", *extra)
    assert status == 0
    for c in calls:
        xs = [x for x, _ in c.seen]
        assert xs and all(type(a) is standin_cupy.ndarray for x in xs for a in (x if isinstance(x, list) else [x]))
    if WORLD.rank == 0:
        rows = rows_of(out)
        assert len(rows) == len(FUNCTIONS) * 4 and all(r[8] == "0" for r in rows), out
        assert "cupy buffers" in out and "# Out of bounds values : 0 OK" in out


# --------------------------------------------------------------------------- the timer


class FakeComm:
    """One real rank and a second one that reports every time one second slower."""

    def __init__(self):
        self.barriers = 0

    def Barrier(self):  # noqa: N802 - mpi4py's name
        self.barriers += 1

    def allgather(self, mine):
        return [mine, [t + 1.0 for t in mine]]


def test_timer_takes_the_max_rotates_and_syncs():
    comm, log, syncs = FakeComm(), [], []
    fns = {name: (lambda name=name: log.append(name)) for name in "abc"}
    samples = _timing.interleave(
        comm, fns, iters=2, rounds=3, warmup={"a": 1, "b": 0, "c": 0}, sync=lambda: syncs.append(1)
    )
    # round 0 from a, round 1 from b backwards (the reverse of b, c, a), round 2 from c
    assert log == ["a"] + ["a", "a", "b", "b", "c", "c"] + ["a", "a", "c", "c", "b", "b"] + [
        "c",
        "c",
        "a",
        "a",
        "b",
        "b",
    ]
    assert comm.barriers == 9 and len(syncs) == 18  # per batch: one barrier, a sync before it and one after
    assert all(len(v) == 3 and all(1.0 <= t < 1.5 for t in v) for v in samples.values())  # the slower rank's
    assert _timing.medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
    assert _timing.paired_ratio({"a": [2.0, 9.0, 4.0], "b": [1.0, 3.0, 1.0]}, "a", "b") == 3.0
    assert _timing.paired_difference({"a": [2.0, 9.0, 4.0], "b": [1.0, 3.0, 1.0]}, "a", "b") == 3.0
    for bad, message in (
        (dict(iters=2, rounds=0), "rounds: expected an int >= 1; got 0"),
        (dict(iters=0, rounds=1), "iters: expected an int >= 1 for 'a'; got 0"),
        (dict(iters=1, rounds=1, warmup=-1), "warmup: expected an int >= 0 for 'a'; got -1"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _timing.interleave(comm, fns, **bad)


def test_timer_the_slowest_rank_dominates():
    slow = WORLD.size - 1
    nap = 0.02
    samples = _timing.interleave(
        WORLD, {"nap": lambda: time.sleep(nap if WORLD.rank == slow else 0)}, iters=2, rounds=3
    )
    assert len(samples["nap"]) == 3 and min(samples["nap"]) >= nap  # on every rank, the sleeper's time
    assert WORLD.allgather(samples) == [samples] * WORLD.size
    comm = hpccoll.Communicator(WORLD)  # an hpccoll Communicator is timed through its .mpi
    try:
        again = _timing.interleave(
            comm, {"nap": lambda: time.sleep(nap if comm.rank == slow else 0)}, iters=1, rounds=1
        )
        assert again["nap"][0] >= nap
    finally:
        comm.free()


# --------------------------------------------------------------------------- info, and the module under mpiexec


def test_info_sections(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    named = hpccoll._comm.as_communicator(None).transport  # the world's, which info reports (a run may name one)

    def text():  # rank 0 prints the report
        for section in ("hpccoll", "MPI", "GPU", "transports", "settings", "environment"):
            assert any(line == section or line.startswith(section + " ") for line in out.splitlines()), section
        assert f"ranks: {WORLD.size} on" in out
        assert "mpi       (numpy arrays) usable" in out
        assert "shm       (numpy arrays) usable" in out  # MPICH makes node-shared windows here
        if named == "auto":
            assert "NumPy arrays take: auto: node-shared memory" in out and "else NumPy arrays use host MPI" in out
        else:
            assert f"NumPy arrays take: transport={named!r} requested" in out

    agree(WORLD, text if WORLD.rank == 0 else True)  # every rank fails together, before the next collective
    assert main(["info", "--json"]) == 0
    out = capsys.readouterr().out

    def data():
        info = json.loads(out)
        assert info["ranks"] == WORLD.size
        assert info["transports"]["shm"]["usable"] and info["transports"]["shm"]["auto"] is None

    agree(WORLD, data if WORLD.rank == 0 else True)


@pytest.mark.skipif(WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")
def test_module_under_mpiexec():
    proc = run_mpiexec(
        2,
        [sys.executable, "-m", "mpi4py", "-m", "hpccoll", "bench", "--collective", "alltoall", "-e", "64", "-r", "1"],
        timeout=120,
    )
    assert "# Out of bounds values : 0 OK" in proc.stdout and "# root 1:" in proc.stdout
