"""The embeddings' norm bound on |s|, read ahead so that the forward's overflow check need not wait
for the forward (SPEC §1 "The overflow check without a wait"; csrc/cuda/evidential_cuda.cpp
NormBound is the cuda backend's).

The forward's overflow check reads a flag of its line statistics on the host: a wait for every
kernel queued before it, after which the GPU idles until the host has queued the next work (1.3 to
1.5 ms a TCL step at K = 16384 on an H200, bench/results/gpu_h200_fourth_lease.md). Every computed
similarity obeys |s_ij| <= B = 2·max_i ‖a_i‖·max_j ‖b_j‖ (Cauchy–Schwarz; the factor 2 covers the
product's rounding up to D = 2^20), and B can be had before the strips: a few small kernels at the start of the
forward, their result copied to pinned host memory without waiting. Reading it after the strips
waits for those kernels only. Where B rules an overflow out (unit-norm embeddings: B = 2), the
flag is not read at all.
"""

from __future__ import annotations

import collections
import math
import weakref

import torch
from torch import Tensor

# Cauchy–Schwarz bounds the exact a_i·b_j by ‖a_i‖‖b_j‖. The product cuBLAS or a tile computes
# differs from it by its operands' rounding (TF32: 2^-11 relative each) and a float32 sum of D
# terms (at most γ_D = D·u/(1 − D·u), u = 2^-24, of Σ|a_ik b_jk| <= ‖a_i‖‖b_j‖); the computed norms
# from the true ones by their float32 sums of squares (γ_D) and, for 16-bit inputs, their rounding
# to the input type (2^-8 at most). Up to D = 2^20 (γ_D < 0.067) that is below a factor 1.3, well
# inside 2; wider embeddings are not bounded this way (MAX_BOUNDED_D). The norms are taken in the
# inputs' own dtype (float32 accumulation; float64 for float64 inputs): a dtype argument would make
# a converted copy of x and y first, K·D·8 bytes at float64 (512 MiB at K = 65536, D = 1024),
# beyond the memory the ops keep to.
PRODUCT_ROUNDING_FACTOR = 2.0
MAX_BOUNDED_D = 2**20

# The bounds the latest loss forwards read, for their backwards (`recalled`): the backward of exp
# evidence in float32 element math then knows without a device read whether a line strength can
# exceed 2^126 (launch._Backward.scaled_variants). An entry holds weak references to the forward's
# embeddings, which autograd hands back to the backward as the same objects (saved inputs), with
# their version counters, and the address, version, shape, strides, dtype and device of the line
# statistics the forward returned (saved outputs: other objects, the same memory and counters). A
# recall needs the very embeddings, alive and unchanged (an in-place change bumps a version), and
# those statistics: a tensor freed since, or another at its address, is not taken for them, and
# embeddings rebuilt by a saved-tensor hook (torch.autograd.graph.save_on_cpu) recall nothing: the
# backward then reads its flag. A forward that reads no bound forgets what its tensors had (`forget`).
# Inference tensors have no version counter: nothing kept. A few entries: forwards whose backwards
# are still to come.
_RECENT: collections.OrderedDict = collections.OrderedDict()
RECENT_BOUNDS = 16


def _key(a: Tensor, b: Tensor, row_stats: Tensor, col_stats: Tensor) -> tuple | None:
    if any(t.is_inference() for t in (a, b, row_stats, col_stats)):
        return None
    stats = tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device)
                  for t in (row_stats, col_stats))
    return (id(a), a._version, id(b), b._version) + stats


def remember(a: Tensor, b: Tensor, row_stats: Tensor, col_stats: Tensor, bound: float) -> None:
    """Keep the bound B a loss forward of embeddings a, b read, with the statistics it returned."""
    key = _key(a, b, row_stats, col_stats)
    if key is not None:
        _RECENT[key] = (weakref.ref(a), weakref.ref(b), bound)
        _RECENT.move_to_end(key)
        while len(_RECENT) > RECENT_BOUNDS:
            _RECENT.popitem(last=False)


def forget(a: Tensor, b: Tensor, row_stats: Tensor, col_stats: Tensor) -> None:
    """Drop what was kept for these tensors (a loss forward that read no bound)."""
    key = _key(a, b, row_stats, col_stats)
    if key is not None:
        _RECENT.pop(key, None)


def recalled(a: Tensor, b: Tensor, row_stats: Tensor, col_stats: Tensor) -> float | None:
    """The bound B the loss forward of these very embeddings read, that returned these very
    statistics (all unchanged since), or None."""
    key = _key(a, b, row_stats, col_stats)
    entry = None if key is None else _RECENT.get(key)
    if entry is None or entry[0]() is not a or entry[1]() is not b:
        return None
    return entry[2]


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
    what the stream has queued after them; on the CPU it is computed at once. Beyond MAX_BOUNDED_D
    nothing is computed and B is inf."""

    def __init__(self, a: Tensor, b: Tensor):
        self._value = None if a.shape[1] <= MAX_BOUNDED_D else math.inf
        self._ready = None
        if self._value is not None:
            return
        norms = [torch.linalg.vector_norm(t, dim=1).amax().double() for t in (a, b)]
        product = norms[0] * norms[1]
        if a.is_cuda:
            self._host = torch.empty((), dtype=torch.float64, pin_memory=True)
            self._host.copy_(product, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(a.device))
        else:
            self._host = product

    def value(self) -> float:
        """B in float64: NaN or inf where an embedding is not finite, inf beyond MAX_BOUNDED_D."""
        if self._value is None:
            if self._ready is not None:
                self._ready.synchronize()
            self._value = PRODUCT_ROUNDING_FACTOR * float(self._host)
        return self._value

    def rules_out_overflow(self, kind: int, inv_tau: float, n: int) -> bool:
        """Whether B alone shows that no line of n candidates can overflow (then no flag read)."""
        return not overflow_possible_below(self.value(), kind, inv_tau, n)
