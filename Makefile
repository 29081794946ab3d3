# The README's two commands: `make demo` (the main job) and `make test`. Both work on a fresh
# machine: `install` puts torch 2.13.0 in place when no torch is importable, then builds the
# package with its C++ extension. Each slow step says what it does before it starts (pip is
# quiet, and a silent minute looks like a hang); on later runs the build is skipped while it is
# current (scripts/install_is_current.py: a C++ or setup edit, or a new torch, rebuilds).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
EXTRAS := test,plots,triton
OUT ?=
METHOD ?= tcl
PYTEST_ARGS ?=

.PHONY: install demo test bench ctest nvcc-check cuda-host-check triton-aot-check static-profile gpu-model triton-test clean

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || { \
		echo "== installing $(TORCH_SPEC): $(PYTHON) has no torch (first run only; a large download unless pip finds a local wheel)"; \
		$(PIP) install --quiet "$(TORCH_SPEC)"; }
	@if ! $(PYTHON) scripts/install_is_current.py --extras $(EXTRAS); then \
		echo "== building evidential_ops and its C++ extension: pip install --no-build-isolation -e \".[$(EXTRAS)]\" (first run, or after a C++/setup change; ~1-2 min on 2 cores)"; \
		$(PIP) install --quiet setuptools wheel ninja && \
		$(PIP) install --quiet --no-build-isolation -e ".[$(EXTRAS)]"; \
	fi

# Without OUT the CLI's own default: runs/<method>, or runs/demo/<method> for METHOD=all.
demo: install
	$(PYTHON) -m evidential_ops demo --method $(METHOD) $(if $(OUT),--out $(OUT))

test: install ctest nvcc-check cuda-host-check triton-aot-check static-profile gpu-model
	$(PYTHON) -m pytest python_tests -q $(PYTEST_ARGS)
	$(MAKE) triton-test PYTHON="$(PYTHON)"
	$(PYTHON) -m pytest bench -q --benchmark-disable

bench: install
	$(PYTHON) -m pytest bench --run-slow --benchmark-json=bench/results/cpu.json
	$(PYTHON) bench/report.py bench/results/cpu.json --out bench/results/cpu.md

# Torch-free C++ unit tests of csrc/kernels/ (CMakeLists.txt), one binary per instruction set.
ctest:
	cmake -S . -B build/ctest
	cmake --build build/ctest -j2
	ctest --test-dir build/ctest --output-on-failure

# Torch-free CUDA sources compiled with nvcc for sm_80 and sm_90 (registers and spills printed);
# skipped, saying so, where nvcc is missing. Needs no GPU.
nvcc-check:
	bash csrc/tests/nvcc_check.sh

# The CUDA backend's host code (csrc/cuda/*.cpp, module.cpp) compiled, syntax only, against the
# installed torch's CUDA headers, with the cuBLAS/cuSPARSE/cuSOLVER headers fetched once into
# build/cuda-host-headers. Needs no GPU and no CUDA torch; skipped, saying so, without nvcc.
cuda-host-check:
	PYTHON=$(PYTHON) bash csrc/tests/cuda_host_check.sh

# Every Triton kernel configuration compiled ahead of time for sm_90 and sm_80 (registers and
# spills printed; a spill in a default configuration on sm_90 fails). Needs no GPU; skipped,
# saying so, where triton cannot compile.
# Then again with the lent GPU machines' own triton (3.6), installed beside the build, default
# configurations and the coverage variants: the compiler the GPU runs, whose tl.dot rejected what
# the newer one accepts (bench/results/gpu_h200_first_lease.md). There its compile failures fail the
# check and its spills are reported; where it cannot be installed the step says so and skips.
TRITON_GPU_VERSION ?= 3.6.0
TRITON_GPU_DIR = build/triton-$(TRITON_GPU_VERSION)
triton-aot-check:
	env -u TRITON_INTERPRET $(PYTHON) -m evidential_ops.triton_backend.aot_check
	@if [ "$$($(PYTHON) -c 'import triton; print(triton.__version__)' 2>/dev/null)" = "$(TRITON_GPU_VERSION)" ]; then \
	  echo "triton-aot-check: triton $(TRITON_GPU_VERSION) checked above"; \
	elif [ -d $(TRITON_GPU_DIR)/triton ] || $(PYTHON) -m pip install -q --no-deps --target $(TRITON_GPU_DIR) \
	    triton==$(TRITON_GPU_VERSION); then \
	  env -u TRITON_INTERPRET PYTHONPATH=$(TRITON_GPU_DIR) $(PYTHON) -m evidential_ops.triton_backend.aot_check \
	    --arch 90 --quick --strict-arch; \
	else echo "triton-aot-check: triton $(TRITON_GPU_VERSION) cannot be installed here: its check skipped"; fi

# Static SASS profile of the element kernels for sm_90, CUDA and Triton (bench/static_profile.py):
# instructions per element by class in each kernel's hot loop, DMUL/DFMA counts, registers and
# spills, into bench/results/static_profile.md and .json (not tracked: the current code's; the
# committed baselines are static_profile_<label>.*). Needs no GPU; skips, saying so, where nvcc or
# triton is missing. About 20 s on 2 cores.
static-profile:
	env -u TRITON_INTERPRET $(PYTHON) bench/static_profile.py --out bench/results/static_profile.md

# GPU performance model (bench/gpu_model.py): per backend, loss, precision, K and D, what a step does
# (GEMMs, bytes per pass, element instructions from the static profile, launches, host syncs) and
# its predicted time on an H100 SXM, H200 and A100 beside the three-GEMM floor, with its terms, and
# the peak extra device memory, into bench/results/gpu_model.md and .json (tracked: regenerate and
# commit after a kernel or launch change). Reuses static-profile's JSON when it is newer than the
# sources (else profiles again, ~30 s); needs no GPU; skips, saying so, without nvcc or triton.
gpu-model:
	env -u TRITON_INTERPRET $(PYTHON) bench/gpu_model.py --out bench/results/gpu_model.md

# The Triton kernels in Triton's interpreter on CPU tensors (float32): the backend-parametrised
# suites' triton cases (evidential losses and InfoNCE) and the Triton-specific tests.
triton-test:
	TRITON_INTERPRET=1 $(PYTHON) -m pytest python_tests/test_fused_backends.py python_tests/test_fused_infonce.py python_tests/test_triton_backend.py \
		python_tests/test_triton_compile_analysis.py \
		-q -k triton $(PYTEST_ARGS)

clean:
	rm -rf build *.egg-info evidential_ops/*.so .pytest_cache .benchmarks
