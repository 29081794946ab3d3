// The Python module evidential_ops._C. Importing it loads the library, which runs the op schemas
// (ops.cpp) and every device's kernel registrations; the module itself only carries what the
// Python op layer needs to know about this binary: the statistics layout, how it was built, and
// the CPU instruction-set switch and the CUDA working budget.
#include <Python.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cpu/packed_gemm.h"
#include "cpu/tile_isa.h"
#include "cuda/strip_plan.h"
#include "kernels/infonce_lines.h"
#include "op_args.h"

namespace {

std::string build_info() {
  std::string info = "compiler=";
#if defined(__clang__)
  info += "clang-" + std::to_string(__clang_major__);
#elif defined(__GNUC__)
  info += "gcc-" + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__);
#else
  info += "unknown";
#endif
  info += ";openmp=";
#if defined(_OPENMP)
  info += std::to_string(_OPENMP);
#else
  info += "off";
#endif
  try {  // a diagnostic must not fail on the very misconfiguration it may be asked to show
    info += ";cpu_isa=" + evidential_ops::cpu::cpu_isa("");
  } catch (const std::invalid_argument&) {
    const char* requested = std::getenv("EO_CPU_ISA");
    info += std::string(";cpu_isa=invalid(EO_CPU_ISA=") + (requested ? requested : "") + ")";
  }
  info += ";cpu_packed_gemm=";
  info += !evidential_ops::cpu::packed_gemm_available() ? "unavailable"
          : evidential_ops::cpu::packed_gemm_enabled()  ? "on"
                                                        : "off(EO_CPU_PACKED_GEMM=0)";
  info += ";cuda=";
#if defined(EO_WITH_CUDA)
  // setup.py passes the arch list as bare tokens (8.0,9.0+PTX): no quotes to survive the shell.
#define EO_STRINGIFY_(...) #__VA_ARGS__
#define EO_STRINGIFY(...) EO_STRINGIFY_(__VA_ARGS__)
  info += "on;cuda_archs=" EO_STRINGIFY(EO_CUDA_ARCHS);
#undef EO_STRINGIFY
#undef EO_STRINGIFY_
#else
  info += "off";
#endif
  return info;
}

// C++ exceptions become ValueError (bad request) or RuntimeError; nothing escapes into Python.
template <typename Fn>
PyObject* as_python_str(const Fn& fn) {
  try {
    const std::string value = fn();
    return PyUnicode_FromStringAndSize(value.data(), static_cast<Py_ssize_t>(value.size()));
  } catch (const std::invalid_argument& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

PyObject* py_build_info(PyObject*, PyObject*) { return as_python_str(build_info); }

PyObject* py_cpu_isa(PyObject*, PyObject* args) {
  const char* request = "";
  if (!PyArg_ParseTuple(args, "|s", &request)) return nullptr;
  const std::string text(request);
  return as_python_str([&] { return evidential_ops::cpu::cpu_isa(text); });
}

// Get (no argument or -1) or set the CUDA kernels' working budget in bytes (csrc/cuda/strip_plan.h).
PyObject* py_cuda_workspace_bytes(PyObject*, PyObject* args) {
  long long request = -1;
  if (!PyArg_ParseTuple(args, "|L", &request)) return nullptr;
  if (request == 0 || request < -1) {
    PyErr_SetString(PyExc_ValueError, "the CUDA workspace budget must be a positive number of bytes");
    return nullptr;
  }
  if (request > 0) evidential_ops::cuda::set_workspace_budget(request);
  return PyLong_FromLongLong(evidential_ops::cuda::workspace_budget());
}

PyMethodDef kMethods[] = {
    {"build_info", py_build_info, METH_NOARGS,
     "build_info() -> str: compiler, OpenMP, CPU instruction set, packed tile GEMMs and CUDA settings of this build."},
    {"cpu_isa", py_cpu_isa, METH_VARARGS,
     "cpu_isa(request='') -> str: the CPU kernels' instruction-set variant in use; a request "
     "('generic', 'avx2', 'avx512', 'best') switches to it (ValueError if not built or not supported)."},
    {"cuda_workspace_bytes", py_cuda_workspace_bytes, METH_VARARGS,
     "cuda_workspace_bytes(bytes=-1) -> int: the working budget of the CUDA kernels (strips of s), set "
     "when bytes > 0; initially EO_CUDA_WORKSPACE_MIB MiB, default 64."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C", "evidential_ops kernels (see evidential_ops/ops.py)", -1,
                       kMethods};

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  PyObject* module = PyModule_Create(&kModule);
  if (module == nullptr) return nullptr;
  if (PyModule_AddIntConstant(module, "NUM_LINE_STATS", evidential_ops::kNumLineStats) < 0 ||
      PyModule_AddIntConstant(module, "NUM_TERMS", evidential_ops::kNumTerms) < 0 ||
      PyModule_AddIntConstant(module, "NUM_GRADIENT_FIELDS", evidential_ops::kNumGradientFields) < 0 ||
      PyModule_AddIntConstant(module, "INFONCE_NUM_LINE_STATS", evidential_ops::kInfoNCELineStats) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
