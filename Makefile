# The README's two commands: `make demo` (the main job) and `make test`. Both work on a fresh
# machine: `install` puts torch 2.13.0 (CPU build, from local disk here) in place when no torch is
# importable, then builds the package with its C++ extension.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
OUT ?= runs/demo
METHOD ?= tcl
PYTEST_ARGS ?=

.PHONY: install demo test bench ctest nvcc-check clean

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet setuptools wheel ninja
	$(PIP) install --quiet --no-build-isolation -e ".[test,plots]"

demo: install
	$(PYTHON) -m evidential_ops demo --method $(METHOD) --out $(OUT)

test: install ctest nvcc-check
	$(PYTHON) -m pytest python_tests -q $(PYTEST_ARGS)
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

clean:
	rm -rf build *.egg-info evidential_ops/*.so .pytest_cache .benchmarks
