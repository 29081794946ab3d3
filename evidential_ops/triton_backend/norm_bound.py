"""The embeddings' norm bound on |s|, read ahead so that the forward's overflow check need not wait
for the forward (SPEC §1 "The overflow check without a wait"; csrc/cuda/evidential_cuda.cpp
NormBound is the cuda backend's).

The forward's overflow check reads a flag of its line statistics on the host: a wait for every
kernel queued before it, after which the GPU idles until the host has queued the next work (1.3 to
1.5 ms a TCL step at K = 16384 on an H200, bench/results/gpu_h200_fourth_lease.md). Every computed
similarity obeys |s_ij| <= B = 2·max_i ‖a_i‖·max_j ‖b_j‖ (Cauchy–Schwarz; the factor 2 covers the
product's rounding), and B can be had before the strips: a few small kernels at the start of the
forward, their result copied to pinned host memory without waiting. Reading it after the strips
waits for those kernels only. Where B rules an overflow out (unit-norm embeddings: B = 2), the
flag is not read at all.
"""

from __future__ import annotations

import collections
import math

import torch
from torch import Tensor

# Cauchy–Schwarz bounds the exact a_i·b_j by ‖a_i‖‖b_j‖; the product cuBLAS or a tile computes
# differs from it by its operands' rounding (TF32: 2^-11 relative each) and a float32 sum of D
# terms (at most D·2^-24 of Σ|a_ik b_jk| <= ‖a_i‖‖b_j‖), and the computed norms from the true ones
# by their float32 sums of squares (D·2^-24) and, for 16-bit inputs, their rounding to the input
# type (2^-8 at most): below a factor 1.01 up to D = 2^14, below 2 up to D = 2^22 (MAX_BOUNDED_D:
# wider embeddings are not bounded this way). The norms are taken in the inputs' own dtype (float32
# accumulation; float64 for float64 inputs): a dtype argument would make a converted copy of x and
# y first, K·D·8 bytes at float64 (512 MiB at K = 65536, D = 1024), beyond the memory the ops keep to.
PRODUCT_ROUNDING_FACTOR = 2.0
MAX_BOUNDED_D = 2**22

# The bounds the latest forwards read, for their backwards (`recalled`): the backward of exp
# evidence in float32 element math then knows without a device read whether a line strength can
# exceed 2^126 (launch._Backward.scaled_variants). A key holds each embedding's address, version
# counter, shape, strides, dtype and device as the forward saw them: autograd keeps a forward's
# inputs alive until its backward, so no other tensor takes their address meanwhile, and an
# in-place change bumps the version. A few entries: forwards whose backwards are still to come.
_RECENT: collections.OrderedDict = collections.OrderedDict()
RECENT_BOUNDS = 16


def _key(a: Tensor, b: Tensor) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device) for t in (a, b))


def recalled(a: Tensor, b: Tensor) -> float | None:
    """The bound B a recent forward of these very embeddings read (unchanged since), or None."""
    return _RECENT.get(_key(a, b))


def overflow_possible_below(largest: float, kind: int, inv_tau: float, n: int) -> bool:
    """Whether Σα of a line of n candidates can overflow double when every |s| <= `largest`
    (evidence `kind`: 0 exp, 1 relu, 2 softplus, 3 exp_tanh): the host's own judgement, no device
    read (csrc/cuda/evidential_cuda.cpp overflow_possible)."""
    if kind not in (0, 1, 2):  # exp_tanh: α <= e + 1
        return False
    scaled = largest * inv_tau  # may be inf (or NaN for a NaN bound): then possible
    if not scaled <= math.inf:
        return True
    if kind == 0:  # exp: α <= e^{s/τ} + 1
        return scaled + math.log(n) > 709.0
    return n * (scaled + 2.0) > 1e307  # relu, softplus: α <= s/τ + 2


class NormBound:
    """B = PRODUCT_ROUNDING_FACTOR · max_i ‖a_i‖ · max_j ‖b_j‖ for embeddings a (M, D), b (N, D),
    started on a's device when constructed and read (`value`) later. On CUDA the result is copied
    to pinned host memory behind an event, so that `value` waits for those kernels alone, not for
    what the stream has queued after them; on the CPU it is computed at once."""

    def __init__(self, a: Tensor, b: Tensor):
        self._d = a.shape[1]
        self._key = _key(a, b)
        norms = [torch.linalg.vector_norm(t, dim=1).amax().double() for t in (a, b)]
        product = norms[0] * norms[1]
        self._ready = None
        if a.is_cuda:
            self._host = torch.empty((), dtype=torch.float64, pin_memory=True)
            self._host.copy_(product, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(a.device))
        else:
            self._host = product

    def value(self) -> float:
        """B in float64 (NaN or inf where an embedding is not finite), remembered for the backward
        (`recalled`)."""
        if self._ready is not None:
            self._ready.synchronize()
        value = PRODUCT_ROUNDING_FACTOR * float(self._host)
        if self._d <= MAX_BOUNDED_D:
            _RECENT[self._key] = value
            _RECENT.move_to_end(self._key)
            while len(_RECENT) > RECENT_BOUNDS:
                _RECENT.popitem(last=False)
        return value

    def rules_out_overflow(self, kind: int, inv_tau: float, n: int) -> bool:
        """Whether B alone shows that no line of n candidates can overflow (then no flag read)."""
        return self._d <= MAX_BOUNDED_D and not overflow_possible_below(self.value(), kind, inv_tau, n)
