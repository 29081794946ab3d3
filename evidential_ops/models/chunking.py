"""Encoding a batch in checkpointed chunks: the encoders' activation memory of one chunk instead
of the whole batch's (docs/training.md "Large batches: encoder chunks").

At contrastive batch sizes the encoders' saved activations, not the fused losses, fill the
memory of a training step (linear in K: bench/results/train_memory_cpu.md). With a chunk size
set, a module's encoders run their per-sample `features` chunk by chunk without keeping the
activations (activation checkpointing), the batch-wide output `norm` runs once on the
concatenation (so BatchNorm sees the whole batch, as without chunks), and the backward recomputes
one chunk at a time. Peak activation memory is then that of one chunk, for one more encoder
forward per update; the result is the unchunked one up to the rounding of the chunks' own GEMMs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .. import checks

__all__ = ["ChunkedEncoding", "set_chunk_size"]


class ChunkedEncoding:
    """Mixin of the modules that encode batches (`DualEncoder`, `UML`): a `chunk_size` and the
    `_encode` every encoder call goes through. `_CHUNKED_ENCODERS` names the encoder attributes.
    """

    _CHUNKED_ENCODERS: tuple[str, ...] = ()

    @property
    def chunk_size(self) -> int | None:
        """Samples per checkpointed encoder chunk, or None (module docstring)."""
        return getattr(self, "_chunk_size", None)

    @chunk_size.setter
    def chunk_size(self, value: int | None) -> None:
        if value is not None:
            value = checks.integer(value, "chunk_size", minimum=1)
            for name in self._CHUNKED_ENCODERS:
                encoder = getattr(self, name)
                if not (callable(getattr(encoder, "features", None)) and callable(getattr(encoder, "norm", None))):
                    raise ValueError(f"chunk_size needs encoders of the form norm(features(...)) (see "
                                     f"models.encoders); {name} ({type(encoder).__name__}) has no features/norm")
        self._chunk_size = value

    def _encode(self, encoder: nn.Module, *inputs: Tensor) -> Tensor:
        """encoder(*inputs), in checkpointed chunks of chunk_size samples while gradients are
        recorded and the batch is larger than a chunk (inputs: tensors with the batch first)."""
        n, chunk = inputs[0].shape[0], self.chunk_size
        if chunk is None or n <= chunk or not torch.is_grad_enabled():
            return encoder(*inputs)
        # Non-reentrant checkpointing recomputes a chunk under the autocast and RNG state of its
        # first run, so dropout masks and autocast dtypes match between the two.
        parts = [checkpoint(encoder.features, *(t[start:start + chunk] for t in inputs), use_reentrant=False)
                 for start in range(0, n, chunk)]
        return encoder.norm(torch.cat(parts))


def set_chunk_size(model: nn.Module, chunk_size: int | None) -> int:
    """Set `chunk_size` on every encoding module inside `model` (TCL's two query models, UML, …);
    None turns chunking off. Returns how many modules were set.

    A ValueError when `model` holds none, or one whose encoders cannot be chunked.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    encoding = [m for m in model.modules() if isinstance(m, ChunkedEncoding)]
    if not encoding:
        raise ValueError(f"model ({type(model).__name__}) holds no encoders to set chunk_size on")
    for m in encoding:
        m.chunk_size = chunk_size
    return len(encoding)
