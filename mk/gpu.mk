# GPU targets (need CuPy and an NVIDIA GPU; docs/gpu.md). Included by the Makefile.
#
#   make test-gpu    the GPU tests on this machine, <= 6 minutes: 1 rank (NCCL, staged,
#                    cuda_mpi if declared), then 2, 3 and 4 ranks sharing its GPU(s)
#                    (staged and cuda_mpi; NCCL where there is one GPU per rank, else its refusal)
#   make bench-gpu   hpccoll vs raw NcclCommunicator / mpi4py, relayout vs a device copy,
#                    staged vs D2H+MPI+H2D by hand: ratios side by side, at 1 and 2 ranks
#
# cuda_mpi is tested only with HPCCOLL_CUDA_AWARE_MPI=1 in the environment: handing device
# pointers to an MPI that is not CUDA-aware crashes (treat the mpich wheel as not CUDA-aware).

GPU_EXTRAS   ?= cuda12
GPU_PYTEST   := $(PYTEST) -q -m gpu tests/test_gpu.py

.PHONY: venv-gpu test-gpu bench-gpu

## venv-gpu: the venv plus CuPy (pip extra $(GPU_EXTRAS)) unless CuPy already imports there
venv-gpu: venv
	@$(PY) -c "import cupy" 2>/dev/null || $(PY) -m pip install -q -e ".[$(EXTRAS),$(GPU_EXTRAS)]"

## test-gpu: the GPU suite at 1-4 ranks (the first run also fills CuPy's kernel cache)
test-gpu: venv-gpu
	timeout 150 $(MPIEXEC) -n 1 $(PY) $(GPU_PYTEST)
	timeout 70 $(MPIEXEC) -n 2 $(PY) $(GPU_PYTEST)
	timeout 70 $(MPIEXEC) -n 3 $(PY) $(GPU_PYTEST)
	timeout 70 $(MPIEXEC) -n 4 $(PY) $(GPU_PYTEST)

## bench-gpu: the GPU benchmark at 1 rank and at 2 ranks
bench-gpu: venv-gpu
	timeout 240 $(MPIEXEC) -n 1 $(PY) -m mpi4py benchmarks/bench_gpu.py
	timeout 240 $(MPIEXEC) -n 2 $(PY) -m mpi4py benchmarks/bench_gpu.py
