"""Mixed precision: the losses take part in torch.autocast like a matmul does (SPEC §5).

Two towers often leave autocast in different dtypes (a bf16 projection and a float32 LayerNorm
output). Inside an autocast region the public losses first bring their inputs to one dtype:
- CUDA: the region's dtype (torch.get_autocast_dtype), as torch.mm would cast them;
- CPU: the promoted dtype of the inputs (bf16 with float32 is float32). The CPU kernels compute
  elements in float32 whatever the input, so a lower precision would only lose digits.
Outside autocast nothing is cast, and inputs of different dtypes stay a TypeError (no silent
promotion). Meta tensors follow the CPU rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["autocast_inputs"]


def autocast_inputs(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The floating `tensors` (all on one device) cast to the dtype autocast gives them, or
    returned unchanged when autocast is off for their device type or they are not all floating."""
    if not all(isinstance(t, Tensor) and t.is_floating_point() for t in tensors):
        return tensors  # the input checks name what is wrong
    device_type = tensors[0].device.type
    if device_type not in ("cuda", "cpu") or not torch.is_autocast_enabled(device_type):
        return tensors
    if device_type == "cuda":
        dtype = torch.get_autocast_dtype("cuda")
    else:
        dtype = tensors[0].dtype
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)
