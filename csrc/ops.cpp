// Schemas of the evidential_ops operator library and the Python module that loads them.
// Importing evidential_ops._C runs the TORCH_LIBRARY blocks below (and the CPU/CUDA kernel
// registrations in their own files); Python then reaches every op through torch.ops.evidential_ops.
#include <Python.h>
#include <torch/library.h>

#include <string>

namespace evidential_ops {

// What this binary was compiled for: lets available_backends() and bug reports say which
// instruction set the CPU kernels use.
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
  info += ";cuda=";
#if defined(EO_WITH_CUDA)
  info += "on";
#else
  info += "off";
#endif
  return info;
}

}  // namespace evidential_ops

TORCH_LIBRARY(evidential_ops, m) {
  m.def("build_info() -> str", &evidential_ops::build_info);
}

extern "C" {
// A module with no Python functions: importing it only loads the library and its registrations.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
