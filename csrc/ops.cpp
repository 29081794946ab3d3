// Schemas of the evidential_ops operator library and the Python module that loads them.
// Importing evidential_ops._C runs the TORCH_LIBRARY blocks below (and the CPU/CUDA kernel
// registrations in their own files); Python then reaches every op through torch.ops.evidential_ops.
#include <Python.h>
#include <torch/library.h>

#include <string>

#include "cpu/tile_isa.h"

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
  info += ";cpu_isa=";
  info += evidential_ops::cpu::active_tile_kernels().isa;
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
  m.def("cpu_isa(str request='') -> str", &evidential_ops::cpu::cpu_isa);
  // The fused loss family (SPEC §2). Rows (x queries y) and columns (y queries x) of s = x·yᵀ;
  // `weights`: a float64 CPU tensor (risk, kl, mse, fmse, logdet) — a tensor, not float[], so
  // that torch.compile does not recompile for every new value of an annealed weight; `stats` are the (2, 7, K) float64 line
  // statistics the backward needs (csrc/kernels/line_terms.h), never a K×K buffer.
  m.def(
      "loss_forward(Tensor x, Tensor y, Tensor? target_scale, str evidence, float tau, Tensor weights, "
      "bool rows, bool cols) -> (Tensor row_losses, Tensor col_losses, Tensor stats)");
  m.def(
      "loss_backward(Tensor grad_rows, Tensor grad_cols, Tensor x, Tensor y, Tensor? target_scale, Tensor stats, "
      "str evidence, float tau, Tensor weights, bool rows, bool cols, bool[2] output_mask) -> (Tensor dx, Tensor dy)");
  m.def(
      "loss_forward_from_similarity(Tensor s, Tensor? target_scale, str evidence, float tau, Tensor weights, "
      "bool rows, bool cols) -> (Tensor row_losses, Tensor col_losses, Tensor stats)");
  m.def(
      "loss_backward_from_similarity(Tensor grad_rows, Tensor grad_cols, Tensor s, Tensor? target_scale, "
      "Tensor stats, str evidence, float tau, Tensor weights, bool rows, bool cols) -> Tensor ds");
  // Log-strengths ln S of every row (N_q) and column (N_g) of a rectangular s (SPEC §1).
  m.def("opinion(Tensor x, Tensor y, str evidence, float tau) -> (Tensor row_log_strength, Tensor col_log_strength)");
  m.def("opinion_from_similarity(Tensor s, str evidence, float tau) -> (Tensor row_log_strength, Tensor col_log_strength)");
}

extern "C" {
// A module with no Python functions: importing it only loads the library and its registrations.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
