"""The GPU benchmark script stays importable and harmless where there is no GPU (CI)."""

import importlib.util
import json
import os
import pathlib
import sys
import time

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


# --------------------------------------------------------------------------- make gpu-check's driver (issue 43)

CHECK = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "gpu" / "gpu_check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_past_its_cap_is_killed_with_its_children(tmp_path):
    check = load_check()
    clock = check.Clock(60)
    marker = tmp_path / "child-survived"
    script = f"import subprocess, sys, time; subprocess.Popen(['sh', '-c', 'sleep 4; touch {marker}']); time.sleep(30)"
    step = check.run_step("slow", [sys.executable, "-c", script], 1, clock, dict(os.environ), tmp_path)
    time.sleep(4.5)
    assert step["status"] == "timed out after 1 s" and step["seconds"] < 10, step
    assert not marker.exists(), "the step's child outlived the step"


def test_the_global_deadline_caps_and_then_skips_steps(tmp_path):
    check = load_check()
    clock = check.Clock(9, reserve=5)  # 4 s left
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    capped = check.run_step("first", argv, 60, clock, dict(os.environ), tmp_path)
    skipped = check.run_step("second", argv, 60, clock, dict(os.environ), tmp_path)
    assert capped["status"].endswith("(the global deadline)"), capped
    assert skipped["status"] == "skipped" and "global deadline (9 s)" in skipped["reason"], skipped


def test_a_failed_step_reports_its_verdict_and_tail(tmp_path):
    check = load_check()
    argv = [sys.executable, "-c", "print('noise'); print('== 3 passed, 1 failed in 0.1s =='); raise SystemExit(1)"]
    step = check.run_step("suite", argv, 30, check.Clock(60), dict(os.environ), tmp_path)
    assert step["status"] == "failed (exit 1)" and step["summary"] == "3 passed, 1 failed in 0.1s", step
    assert step["tail"].startswith("noise")


def test_the_report_says_every_step_and_why(tmp_path):
    check = load_check()
    report = {
        "date": "2026-12-04T00:00:00+00:00",
        "mode": "device",
        "bundle": {"made": "x", "commit": "abc", "python": "3.12", "nccl": "libnccl.so.2.xz"},
        "deadline_s": 480,
        "facts": {"gpu": "1 x NVIDIA H200", "nccl": 22809},
        "multi_rank_nccl": "on",
        "steps": [
            {
                "step": "suite-2",
                "status": "passed",
                "seconds": 9.5,
                "summary": "146 passed",
                "tail": "t",
                "command": "c",
            },
            {"step": "bench-4", "status": "skipped", "reason": "the global deadline (480 s) was reached"},
        ],
    }
    assert check._finish(report, tmp_path, check.Clock(480)) == 0
    (md,) = tmp_path.glob("gpu-check-*.md")
    text = md.read_text()
    assert "| gpu | 1 x NVIDIA H200 |" in text and "| suite-2 | passed | 9.5 | 146 passed |" in text
    assert "| bench-4 | skipped |  | the global deadline (480 s) was reached |" in text
    (js,) = tmp_path.glob("gpu-check-*.json")
    assert json.loads(js.read_text())["steps"][1]["status"] == "skipped"
