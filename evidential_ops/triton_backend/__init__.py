"""The `triton` backend: fused Triton kernels of the evidential_ops op family (README "Backends").

Registered (and listed by `eo.available_backends()`) when triton imports, the C++ extension (which
holds the op schemas) loaded, and either a CUDA device is present or TRITON_INTERPRET=1 was set
before the import: then the kernels run in Triton's interpreter on CPU tensors (float32 only in
practice: the interpreter is slow), which is how CI and machines without a GPU test them.
`UNAVAILABLE` says why it is not registered otherwise.

The op family is the C++ one (`evidential_ops.ops.schemas()`), defined again under the namespace
`evidential_ops_triton`, with the shared fakes and autograd (`ops.register_family`), and a second
time under `evidential_ops_triton_tf32` whose tile products use TF32 (`matmul_precision="tf32"` of
the public API; the schemas have no precision argument, so the precision is the family's).
"""

from __future__ import annotations

import os

import torch

from .. import backends, ops

NAMESPACE = "evidential_ops_triton"
TF32_NAMESPACE = "evidential_ops_triton_tf32"


def _why_unavailable() -> str | None:
    if ops.LAYOUT is None:
        return "the C++ extension (which defines the op schemas) is not loaded"
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        return "no CUDA device (set TRITON_INTERPRET=1 before importing to run the kernels on CPU tensors)"
    try:
        import triton  # noqa: F401
    except ImportError as error:
        return f"triton is not importable: {error}"
    return None


UNAVAILABLE = _why_unavailable()


class TritonBackend(backends.KernelBackend):
    """KernelBackend over `evidential_ops_triton`; matmul_precision="tf32" of float32 embeddings on
    CUDA goes to the TF32 family."""

    def __init__(self, supports):
        super().__init__("triton", NAMESPACE, supports)
        self._tf32 = backends.KernelBackend("triton", TF32_NAMESPACE, supports)

    def losses(self, x, y, target_scale, config):
        if config.matmul_precision == "tf32" and x.dtype == torch.float32 and x.device.type == "cuda":
            return self._tf32.losses(x, y, target_scale, config)
        return super().losses(x, y, target_scale, config)


if UNAVAILABLE is None:
    from . import registration

    registration.register_families((NAMESPACE, "ieee"), (TF32_NAMESPACE, "tf32"))
    backends.register(TritonBackend(registration.supports))
