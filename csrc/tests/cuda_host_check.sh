#!/usr/bin/env bash
# Compiles the CUDA backend's host code (csrc/cuda/*.cpp, and module.cpp as a CUDA build sees it)
# against the installed torch's CUDA headers, syntax only: no GPU, no CUDA torch, no link. A CPU
# torch wheel ships ATen/cuda and c10/cuda headers; what it lacks is added under
# build/cuda-host-headers: the CUDA runtime headers of the nvcc install, the cuBLAS, cuSPARSE and
# cuSOLVER headers (ATen/cuda/CUDAContext.h includes them) taken from the nvidia-* wheels of CUDA
# 13.0.2 (pip download, headers kept, wheels deleted: ~1 GB downloaded once, 2 MB kept), and the
# one header a CUDA torch build generates (c10/cuda/impl/cuda_cmake_macros.h). Without this check the host
# code is first compiled on a GPU machine, where a typo costs the session's device time.
# Exits non-zero on a compile error or a warning in the project's own files; skips (exit 0, saying
# so) where nvcc or the headers cannot be had.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
CXX=${CXX:-g++}
NVCC=${NVCC:-$(command -v nvcc || true)}
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then
  echo "cuda-host-check: nvcc not found: skipping (the CUDA runtime headers come with it)"
  exit 0
fi
# The toolkit's include directory: nvcc may be a wrapper script, so ask nvcc itself.
cuda_include=$("$NVCC" --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ INCLUDES="-I\([^"]*\)".*/\1/p' | head -n 1)
cuda_include=${cuda_include%/}
if [[ ! -f "$cuda_include/cuda_runtime_api.h" ]]; then
  echo "cuda-host-check: no cuda_runtime_api.h beside $NVCC (found '$cuda_include'): skipping"
  exit 0
fi
# TORCH_INCLUDE: another torch's headers (e.g. the include/ of a CUDA wheel the GPU machines run).
torch_include=${TORCH_INCLUDE:-$("$PYTHON" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")}
python_include=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
for needed in "$torch_include/ATen/cuda/CUDAContext.h" "$python_include/Python.h"; do
  if [[ ! -f "$needed" ]]; then
    echo "cuda-host-check: $needed is missing: skipping"
    exit 0
  fi
done
headers=build/cuda-host-headers
CUDA_HOST_WHEELS=(nvidia-cublas==13.1.0.3 nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66)
if [[ "$(cat "$headers/wheels.txt" 2>/dev/null)" != "${CUDA_HOST_WHEELS[*]}" ]]; then
  echo "cuda-host-check: fetching the cuBLAS, cuSPARSE and cuSOLVER headers (pip download, ~1 GB once)"
  rm -rf "$headers" && mkdir -p "$headers/include" "$headers/wheels"
  # The versions CUDA 13.0.2 ships (cuda-toolkit==13.0.2, which the GPU machines' torch 2.11.0+cu130
  # requires), not the newest: headers of a later toolkit could declare what nvcc 13.0's lack.
  if ! "$PYTHON" -m pip download --quiet --no-deps -d "$headers/wheels" "${CUDA_HOST_WHEELS[@]}" \
      >"$headers/pip.log" 2>&1; then
    echo "cuda-host-check: the nvidia-* wheels cannot be downloaded here: skipping ($(tail -n 1 "$headers/pip.log"))"
    rm -rf "$headers"
    exit 0
  fi
  "$PYTHON" - "$headers" <<'EOF'
import glob, os, sys, zipfile
out = os.path.join(sys.argv[1], "include")
for wheel in glob.glob(os.path.join(sys.argv[1], "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if "include" in parts[:-1] and name.endswith(".h"):
                with open(os.path.join(out, parts[-1]), "wb") as f:
                    f.write(z.read(name))
EOF
  rm -rf "$headers/wheels" "$headers/pip.log"
  echo "${CUDA_HOST_WHEELS[*]}" >"$headers/wheels.txt"
fi
generated=()
if [[ ! -f "$torch_include/c10/cuda/impl/cuda_cmake_macros.h" ]]; then
  mkdir -p "$headers/generated/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$headers/generated/c10/cuda/impl/cuda_cmake_macros.h"
  generated=(-I "$headers/generated")
fi
# setup.py's flags for the C++ sources of a CUDA build; C++17 as torch's extensions build.
flags=(-std=c++17 -fsyntax-only -fopenmp -Wall -Wno-unknown-pragmas -DEO_WITH_CUDA -DEO_CUDA_ARCHS=9.0a
       "${generated[@]}" -I "$torch_include" -I "$torch_include/torch/csrc/api/include" -isystem "$cuda_include"
       -isystem "$headers/include" -isystem "$python_include" -I csrc)
status=0
mapfile -t files < <(ls csrc/cuda/*.cpp csrc/module.cpp)
for file in "${files[@]}"; do
  log=$(mktemp)
  if ! "$CXX" "${flags[@]}" "$file" >"$log" 2>&1; then
    echo "cuda-host-check: FAILED $file:"
    grep -E "^csrc/.*(error|warning)|error:" "$log" | head -n 40
    status=1
  elif grep -q "^csrc/.*warning" "$log"; then
    echo "cuda-host-check: warnings in $file:"
    grep -A3 "^csrc/.*warning" "$log" | head -n 40
    status=1
  fi
  rm -f "$log"
done
echo "cuda-host-check: ${#files[@]} file(s) compiled (syntax only) against the CUDA headers under $torch_include:" \
  "$([[ $status == 0 ]] && echo ok || echo FAILED)"
exit $status
