"""Defines the Triton op families on the shared schemas, visible to torch.compile.

What `torch.library.triton_op` does, done by hand because triton_op infers its schema from type
hints (its `schema=` argument is not used in torch 2.11-2.13, and inference turns `int` into
`SymInt` and drops the return names): the families must have exactly the C++ schemas
(`ops.schemas()`) so that `ops.register_family` gives them the same fakes and autograd.

- eager: each op's kernel is registered for the CUDA dispatch key (CPU under the interpreter) and
  launches its Triton kernels directly (wrap_triton disabled, as triton_op's eager path does);
- torch.compile / AOTAutograd: under FunctionalTensorMode the op decomposes into its
  implementation, whose launches go through `torch.library.wrap_triton`, so Inductor sees the
  Triton kernels themselves (user-defined Triton kernels in the graph), like a triton_op; calls
  that multiply with cuBLAS stay opaque (`_cublas_products`: by default those from float32 and
  16-bit embeddings, but for TF32 ones at D <= 512 and 16-bit backwards fused in registers). The
  interpreter's kernels cannot be traced: there the ops stay opaque (the fakes trace them).
- `EO_TRITON_OPAQUE=1` keeps the ops opaque on CUDA too (a fallback, should a PyTorch version
  reject the decomposition).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from .. import ops
from . import configs, infonce_launch, launch

_LIBRARIES: list[torch.library.Library] = []

# op name -> implementation (same arguments as the schema, matmul_precision included)
_IMPLEMENTATIONS = {
    "line_stats": launch.line_stats,
    "line_losses": launch.line_losses,
    "loss_forward": launch.loss_forward,
    "loss_backward": launch.loss_backward,
    "loss_forward_from_similarity": launch.loss_forward_from_similarity,
    "loss_backward_from_similarity": launch.loss_backward_from_similarity,
    "opinion": launch.opinion,
    "opinion_from_similarity": launch.opinion_from_similarity,
    "infonce_forward": infonce_launch.infonce_forward,
    "infonce_backward": infonce_launch.infonce_backward,
}


def supports(device: torch.device) -> bool:
    return device.type == ("cpu" if configs.interpreting() else "cuda")


def _wrap_triton_disabled():
    try:
        from torch._library.triton import set_wrap_triton_enabled
    except ImportError:  # older layouts: wrap_triton then just traces nothing in eager mode
        return contextlib.nullcontext()
    return set_wrap_triton_enabled(False)


def _eager(fn):
    @functools.wraps(fn)
    def kernel(*args, **kwargs):
        with _wrap_triton_disabled():
            return fn(*args, **kwargs)

    return kernel


def _cublas_products(op, name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the op's implementation multiplies with cuBLAS for these arguments: the ops of
    embeddings whose s comes from cuBLAS strips (launch.similarity_strips: float32 IEEE and 16-bit
    inputs at every D), loss_backward of float32 embeddings (its strips or blocks of G, at the op's
    matmul_precision, which is torch's global TF32 switch set around the products in eager mode)
    and both InfoNCE ops of float32 and 16-bit embeddings (infonce_launch.uses_strips). Traced into
    a graph, such products would run as the switch says when the graph runs (on an H200 the
    compiled gradient of a "tf32" call differed from the eager one by up to 14 % an element,
    torch.library.opcheck), the forward would take its tile kernels (another summation order:
    line_stats failed opcheck's eager-vs-traced comparison there), and the InfoNCE ops would fall
    back to their tile kernels, 29-32x plain PyTorch's time there."""
    bound = ops.bound_arguments(op, args, kwargs)
    x = bound.get("x")
    if not isinstance(x, torch.Tensor):
        return False
    if name.startswith("infonce"):
        return infonce_launch.strips_take(x.dtype)
    strips = launch.similarity_strips(x.dtype, x.shape[-1], bound["matmul_precision"])
    if name != "loss_backward":
        return strips
    # 16-bit inputs whose backward is one fused kernel (D within a register block) multiply nothing
    # with cuBLAS: that call still decomposes.
    mask = bound["output_mask"]
    fused = launch.BackwardPlan.fuses(x.dtype, x.shape[-1], bool(mask[0]), bool(mask[1]),
                                      configs.has_default("grad_fused", x.device))
    return launch.follows_tf32_switch(x.dtype) or (strips and not fused)


def _decomposition(fn, name: str):
    """triton_op's FunctionalTensorMode rule: trace into `fn` (its wrap_triton launches become
    graph nodes), except under torch.export, which keeps custom ops whole, and for calls that
    multiply with cuBLAS (_cublas_products): those stay one opaque op in the graph, which runs `fn`
    eagerly (products at the op's own precision, InfoNCE from strips)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    def rule(mode, op, types, args, kwargs):
        try:
            from torch.export._trace import custom_triton_ops_decomposition_disabled
        except ImportError:
            custom_triton_ops_decomposition_disabled = lambda: False
        if custom_triton_ops_decomposition_disabled() or _cublas_products(op, name, args, kwargs):
            return mode.__torch_dispatch__(op, types, args, kwargs)
        if any(not issubclass(t, FakeTensor) and t not in (torch.Tensor, FunctionalTensor) for t in types):
            return NotImplemented
        with mode:
            return fn(*args, **kwargs)

    return rule


def _record_kernels(qualname: str) -> None:
    """AOTAutograd's cache key includes the source of a triton_op's kernels (best effort: private)."""
    try:
        from torch._library import triton as library_triton

        from . import kernels

        library_triton.triton_ops_to_kernels[qualname] = [
            kernels.stats_kernel, kernels.reduce_partials_kernel, kernels.grad_fused_kernel, kernels.grad_block_kernel,
            kernels.grad_similarity_kernel,
            kernels.line_loss_kernel, kernels.line_gradient_kernel,
        ]
    except (ImportError, AttributeError):
        pass


def register_family(namespace: str) -> None:
    """Define the family on the C++ schemas under `namespace`, with kernels, the decomposition for
    torch.compile, and the shared fakes and autograd."""
    schemas = ops.schemas()
    interpret = configs.interpreting()
    opaque = interpret or os.environ.get("EO_TRITON_OPAQUE", "0") == "1"
    dispatch_key = "CPU" if interpret else "CUDA"
    library = torch.library.Library(namespace, "DEF")
    _LIBRARIES.append(library)
    for name in ops.OPS:
        fn = _IMPLEMENTATIONS[name]
        library.define(name + schemas[name])
        library.impl(name, _eager(fn), dispatch_key)
        if not opaque:
            from torch._subclasses.functional_tensor import FunctionalTensorMode

            qualname = f"{namespace}::{name}"
            torch.library.register_torch_dispatch(qualname, FunctionalTensorMode, _decomposition(fn, name), lib=library)
            _record_kernels(qualname)
    ops.register_family(namespace)
