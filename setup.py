"""Builds evidential_ops._C: the C++ CPU kernels always, the CUDA kernels with a CUDA build of torch.

The CUDA part (csrc/cuda/) is built whenever torch is a CUDA build and nvcc is found (CUDA_HOME,
or nvcc on the PATH), with or without a visible GPU. Environment knobs (the usual ones of PyTorch
extensions):
  MAX_JOBS=N                parallel compile jobs (ninja)
  FORCE_CUDA=1              fail, instead of building the CPU part only, when the CUDA part cannot be built
  SKIP_CUDA_BUILD=1         never build CUDA sources
  TORCH_CUDA_ARCH_LIST=...  CUDA architectures, default "8.0;9.0+PTX" (A100, H100, PTX for newer GPUs)
  EO_DEBUG=1                -O0 -g instead of -O3 (nvcc: -G)
"""

import glob
import os
import sys

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


def _sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def _nvcc_found() -> bool:
    return CUDA_HOME is not None and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))


def _build_cuda(cuda_sources: list[str]) -> bool:
    if _flag("SKIP_CUDA_BUILD") or not cuda_sources:
        return False
    cuda_torch = torch.version.cuda is not None
    if _flag("FORCE_CUDA") and not (cuda_torch and _nvcc_found()):
        raise RuntimeError(
            f"FORCE_CUDA=1 needs a CUDA build of torch (this one: {torch.__version__}) and nvcc "
            f"(CUDA_HOME={CUDA_HOME})"
        )
    return cuda_torch and _nvcc_found()


def _nvidia_wheel_dirs(sub: str, marker: str) -> list[str]:
    """Directories `nvidia/*/<sub>` of the CUDA wheels installed beside torch that hold `marker`."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    return sorted({os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "*", sub, marker))})


def _cublas_flags() -> tuple[list[str], list[str], list[str]]:
    """(cxx flags, libraries, link args) for cuBLAS, whose handle the launcher borrows from torch.

    A full CUDA toolkit has its headers and libcublas.so in CUDA_HOME; a pip-installed torch may
    come with a toolkit that has nvcc only, and its own cuBLAS in the nvidia-* wheels: then those
    headers are searched after CUDA_HOME's (-idirafter) and that libcublas.so.N is linked. Without
    either, the symbols still resolve at load time through libtorch_cuda, which links cuBLAS.
    """
    cxx, libraries, link = [], [], []
    if not os.path.exists(os.path.join(CUDA_HOME, "include", "cublas_v2.h")):
        for d in _nvidia_wheel_dirs("include", "cublas_v2.h")[:1]:
            cxx += ["-idirafter", d]
    if glob.glob(os.path.join(CUDA_HOME, "lib64", "libcublas.so")):
        libraries.append("cublas")
    else:
        for d in _nvidia_wheel_dirs("lib", "libcublas.so*")[:1]:
            link += sorted(glob.glob(os.path.join(d, "libcublas.so.[0-9]*")))[:1]
    return cxx, libraries, link


def _runtime_link_args() -> list[str]:
    """Link flags that make the extension share torch's C++ runtime.

    A C++ op's error (TORCH_CHECK_VALUE, a ValueError in Python) is a C++ exception thrown in the
    extension and caught in torch's dispatcher: both must use the one libstdc++.so.6. The linker
    takes libstdc++.a wherever the compiler's own library folder has no usable libstdc++.so: one
    GPU machine's GCC (/opt/gcc) had the archive beside a dangling libstdc++.so link, so the
    extension got a copy of the runtime of its own, and the first such error crashed the process.
    -lstdc++ finds the same dangling link and the same archive; the shared object named by its
    soname (-l:libstdc++.so.6) exists only as the shared runtime, in the system's library folders,
    and coming before the driver's own libraries it resolves every C++ runtime symbol, so the
    archive is never pulled in (also under -static-libstdc++).
    """
    return ["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else []


def extension():
    debug = _flag("EO_DEBUG")
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    # OpenMP makes at::parallel_for parallel inside the extension (torch ships libgomp.so.1 and the
    # loader reuses it: one thread pool) and lets `omp simd` vectorise the tile loops' reductions.
    # -fno-math-errno and -fno-trapping-math change no result (torch builds with both; this is
    # not -ffast-math, which would change results): they let selects between computed values become
    # vector blends instead of branches, without which the special functions do not vectorise.
    cxx += ["-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-unknown-pragmas"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    cpu_sources = _sources("csrc/*.cpp") + _sources("csrc/cpu/**/*.cpp")
    cuda_sources = _sources("csrc/cuda/**/*.cu") + _sources("csrc/cuda/**/*.cpp")
    if _build_cuda(cuda_sources):
        # torch.utils.cpp_extension reads the arch list from the environment: set the default there.
        archs = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
        # Bare tokens (module.cpp stringifies them): quotes and ';' would not survive ninja's shell.
        archs_define = "-DEO_CUDA_ARCHS=" + ",".join(a for a in archs.replace(";", " ").split() if a)
        nvcc = ["-G"] if debug else ["-O3", "-lineinfo"]  # -G implies full device debug info
        nvcc += ["--expt-relaxed-constexpr", "-DEO_WITH_CUDA"]
        blas_cxx, blas_libraries, blas_link = _cublas_flags()
        return CUDAExtension(
            "evidential_ops._C",
            cpu_sources + cuda_sources,
            include_dirs=include_dirs,
            libraries=blas_libraries,
            extra_compile_args={"cxx": cxx + ["-DEO_WITH_CUDA", archs_define] + blas_cxx, "nvcc": nvcc},
            extra_link_args=["-fopenmp"] + blas_link + _runtime_link_args(),
        )
    return CppExtension(
        "evidential_ops._C",
        cpu_sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx},
        extra_link_args=["-fopenmp"] + _runtime_link_args(),
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
