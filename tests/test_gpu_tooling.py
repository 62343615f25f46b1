"""The GPU benchmark script stays importable and harmless where there is no GPU (CI)."""

import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gpu.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_gpu_imports_without_cupy_and_parses_sizes():
    bench = load()
    assert [bench.nbytes(s) for s in ("512", "1K", "64M", "2G")] == [512, 1024, 64 << 20, 2 << 30]
    args = bench.parse(["--sizes", "1K,1M", "--rounds", "2"])
    assert (args.sizes, args.rounds, args.quick) == ("1K,1M", 2, False)


def test_bench_gpu_says_why_it_skips(capsys):
    bench = load()
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        assert bench.main(["--quick"]) == 0
        assert "skipped: needs CuPy and a CUDA GPU" in capsys.readouterr().out
    else:  # pragma: no cover - a GPU machine: make bench-gpu runs the real thing
        pytest.skip("a GPU is here; run make bench-gpu")
