"""The `triton` backend: fused Triton kernels of the evidential_ops op family (README "Backends").

Registered (and listed by `eo.available_backends()`) when triton imports, the C++ extension (which
holds the op schemas) loaded, and either a CUDA device is present or TRITON_INTERPRET=1 was set
before the import: then the kernels run in Triton's interpreter on CPU tensors (float32 only in
practice: the interpreter is slow), which is how CI and machines without a GPU test them.
`UNAVAILABLE` says why it is not registered otherwise.

The op family is the C++ one (`evidential_ops.ops.schemas()`), defined again under the namespace
`evidential_ops_triton`, with the shared fakes and autograd (`ops.register_family`).
"""

from __future__ import annotations

import torch

from .. import backends, ops
from . import configs

NAMESPACE = "evidential_ops_triton"


def _why_unavailable() -> str | None:
    if ops.LAYOUT is None:
        return "the C++ extension (which defines the op schemas) is not loaded"
    if not configs.interpreting() and not torch.cuda.is_available():
        return "no CUDA device (set TRITON_INTERPRET=1 before importing to run the kernels on CPU tensors)"
    try:
        import triton  # noqa: F401
    except ImportError as error:
        return f"triton is not importable: {error}"
    return None


UNAVAILABLE = _why_unavailable()


if UNAVAILABLE is None:
    from . import registration

    registration.register_family(NAMESPACE)
    backends.register(backends.KernelBackend("triton", NAMESPACE, registration.supports))
