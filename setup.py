"""Builds evidential_ops._C: the C++ CPU kernels always, the CUDA kernels with a CUDA build of torch.

Environment knobs (the usual ones of PyTorch extensions):
  MAX_JOBS=N                parallel compile jobs (ninja)
  FORCE_CUDA=1              build CUDA sources even if no GPU is visible (needs CUDA torch + nvcc)
  SKIP_CUDA_BUILD=1         never build CUDA sources
  TORCH_CUDA_ARCH_LIST=...  CUDA architectures, e.g. "8.0;9.0"
  EO_DEBUG=1                -O0 -g instead of -O3
"""

import glob
import os

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


def _sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _build_cuda(cuda_sources: list[str]) -> bool:
    if _flag("SKIP_CUDA_BUILD") or not cuda_sources:
        return False
    cuda_torch = torch.version.cuda is not None and CUDA_HOME is not None
    if _flag("FORCE_CUDA") and not cuda_torch:
        raise RuntimeError("FORCE_CUDA=1 needs a CUDA build of torch and nvcc (CUDA_HOME)")
    return cuda_torch and (_flag("FORCE_CUDA") or torch.cuda.is_available() or "TORCH_CUDA_ARCH_LIST" in os.environ)


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
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
        nvcc = ["-O3" if not debug else "-G", "--expt-relaxed-constexpr", "-DEO_WITH_CUDA"]
        cxx += [f'-DEO_CUDA_ARCHS="{archs}"']
        return CUDAExtension(
            "evidential_ops._C",
            cpu_sources + cuda_sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx + ["-DEO_WITH_CUDA"], "nvcc": nvcc + [f'-DEO_CUDA_ARCHS="{archs}"']},
            extra_link_args=["-fopenmp"],
        )
    return CppExtension(
        "evidential_ops._C",
        cpu_sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx},
        extra_link_args=["-fopenmp"],
    )


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
