"""`python -m hpccoll info` and `bench`: run in-process at the suite's rank count, output parsed."""

import json
import pathlib
import sys

import pytest
from launch import run_mpiexec
from mpi4py import MPI

from hpccoll.__main__ import main

pytestmark = pytest.mark.mpi


def rows_of(text):
    """The data rows of a bench table: every line not starting with '#'."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--uneven", "--axis", "1"],
        ["-d", "float16", "-o", "avg"],
        ["-d", "bool", "-o", "max"],
        ["-d", "int64", "-o", "prod", "--baseline"],
    ],
)
def test_bench_table(capsys, extra):
    status = main(["bench", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-r", "1", *extra])
    out = capsys.readouterr().out
    assert status == 0
    if MPI.COMM_WORLD.rank != 0:
        assert out == ""
        return
    rows = rows_of(out)
    assert len(rows) == 3 * 4  # three collectives, sizes 8 B, 64 B, 512 B, 4 KiB
    width = 5 + 8 + (2 if "--baseline" in extra else 0)
    for row in rows:
        assert len(row) == width, row
        assert row[8] == "0" and row[12] == "0", f"#wrong must be 0: {row}"  # out-of-place, in-place
        assert float(row[5]) > 0 and float(row[9]) > 0
    assert "# Out of bounds values : 0 OK" in out
    assert "# Avg bus bandwidth" in out


def test_bench_json_and_bus_bandwidth(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path = MPI.COMM_WORLD.bcast(str(path))
    assert (
        main(["bench", "-c", "allreduce", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "-r", "1", "--json", path]) == 0
    )
    capsys.readouterr()
    MPI.COMM_WORLD.Barrier()
    data = json.loads(pathlib.Path(path).read_text())
    (row,) = data["rows"]
    n = MPI.COMM_WORLD.size
    assert row["size"] == 1024 and row["count"] == 256
    assert row["oop"]["busbw"] == pytest.approx(row["oop"]["algbw"] * 2 * (n - 1) / n)
    assert row["oop"]["algbw"] == pytest.approx(1024 / 1e9 / (row["oop"]["time_us"] / 1e6))


def test_info_sections(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.rank == 0:
        for section in ("hpccoll", "MPI", "GPU", "transports", "settings", "environment"):
            assert any(line == section or line.startswith(section + " ") for line in out.splitlines()), section
        assert f"ranks: {MPI.COMM_WORLD.size} on" in out
        assert "mpi       (numpy arrays) usable" in out
        assert "shm       (numpy arrays) usable" in out  # MPICH makes node-shared windows here
        assert "NumPy arrays take: auto: node-shared memory" in out and "else NumPy arrays use host MPI" in out
    assert main(["info", "--json"]) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.rank == 0:
        info = json.loads(out)
        assert info["ranks"] == MPI.COMM_WORLD.size
        assert info["transports"]["shm"]["usable"] and info["transports"]["shm"]["auto"] is None


def test_usage_and_bad_arguments(capsys):
    assert main([]) == 2 and "usage" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2 and "expected a command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "-d", "float128"])
    assert "expected a dtype" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "-b", "lots"])


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="launches its own mpiexec; runs in the serial suite")
def test_module_under_mpiexec():
    proc = run_mpiexec(
        2,
        [sys.executable, "-m", "mpi4py", "-m", "hpccoll", "bench", "-c", "allgather", "-e", "64", "-n", "2"],
        timeout=120,
    )
    assert "# Out of bounds values : 0 OK" in proc.stdout
