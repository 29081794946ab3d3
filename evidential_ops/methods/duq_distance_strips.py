"""DUQ's probabilistic distance matrix without its (B, B, K_p, K_p') cosine tensor.

D_ij = max over the K_p × K_p' sample pairs of 1 − cos (min on the diagonal; DUQ eq. 10-11, SPEC §3
"DUQ"). `methods.duq.duq_distance_matrix` forms every pair's K_p·K_p' cosines at once and keeps them
for autograd: 49·B² floats at K_p = 7 (3.3 GB at B = 4096 in float32, ~15 GB with autograd's
copies). Here the text rows are visited in strips: a strip's cosines are reduced to its rows of D
at once, keeping only which sample pair (m, n) attained each D_ij (two int8 per pair). D is a
max/min, so its gradient flows through that pair alone: ∂D_ij/∂t̂_i^m = −v̂_j^n (unit vectors),
and the backward gathers, for each (m, n), the (B, B) entries of ∂L/∂D that (m, n) attained into
two GEMMs (−G_mn·v̂^n into t̂^m, −G_mnᵀ·t̂^m into v̂^n), then through the normalisation.

Memory: D and the pair indices (B² floats + 2·B² bytes), one strip's cosines, one G_mn. Compute:
the forward's B²·K_p·K_p'·D multiply-adds, twice that in the backward. At an exact tie the
gradient goes to the first maximising pair (torch.argmax) where torch.amax would split it evenly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks
from ..config import NORMALIZE_EPS
from . import _common
from .duq import sample_pair

__all__ = ["duq_distance_matrix_strips"]

DEFAULT_STRIP_ELEMENTS = 1 << 22  # cosines per strip (16 MiB in float32)


class _StripDistances(torch.autograd.Function):
    @staticmethod
    def forward(ctx, text, video, diagonal_min: bool, strip_elements: int):
        b_t, k_p, _ = text.shape
        b_v, k_q, _ = video.shape
        distance = text.new_empty((b_t, b_v))
        attained = torch.empty((b_t, b_v), dtype=torch.int16, device=text.device)  # m·K_p' + n
        for rows in _common.row_strips(b_t, strip_elements, b_v * k_p * k_q):
            start = rows.start
            cos = torch.einsum("imd,jnd->ijmn", text[rows], video).reshape(rows.stop - start, b_v, k_p * k_q)
            far_cos, far_at = cos.min(dim=2)  # max distance = min cosine
            if diagonal_min:
                near_cos, near_at = cos.max(dim=2)
                local = torch.arange(start, rows.stop, device=text.device)
                far_cos[torch.arange(rows.stop - start), local] = near_cos[torch.arange(rows.stop - start), local]
                far_at[torch.arange(rows.stop - start), local] = near_at[torch.arange(rows.stop - start), local]
            distance[rows] = 1.0 - far_cos
            attained[rows] = far_at.to(torch.int16)
        ctx.save_for_backward(text, video, attained)
        ctx.k_q = k_q
        return distance

    @staticmethod
    def backward(ctx, grad_distance):
        text, video, attained = ctx.saved_tensors
        k_p, k_q = text.shape[1], ctx.k_q
        grad_text = torch.zeros_like(text)
        grad_video = torch.zeros_like(video)
        for m in range(k_p):
            for n in range(k_q):
                g = torch.where(attained == m * k_q + n, grad_distance, 0.0)  # ∂L/∂D where (m, n) attained D
                grad_text[:, m] -= g @ video[:, n]
                grad_video[:, n] -= g.T @ text[:, m]
        return grad_text, grad_video, None, None


def duq_distance_matrix_strips(
    z_text: Tensor,
    z_video: Tensor,
    *,
    diagonal_min: bool = True,
    check_finite: bool = True,
    strip_elements: int = DEFAULT_STRIP_ELEMENTS,
) -> Tensor:
    """`duq_distance_matrix(z_text, z_video)` (DUQ eq. 10-11) without the (B, B, K_p, K_p')
    tensor (module docstring); the same values, and the same gradient away from exact ties.

    Args:
        z_text: (B_t, K_p, D) text embeddings; z_video: (B_v, K_p', D) video embeddings; B_v = B_t
            when diagonal_min=True. K_p·K_p' <= 32767.
        strip_elements: cosines per strip (text rows per strip = max(1, strip_elements // (B_v·K_p·K_p'))).
    Returns:
        (B_t, B_v) distances in [0, 2], in the input dtype.
    """
    z_text, z_video, diagonal_min = sample_pair(z_text, z_video, diagonal_min, check_finite)
    pairs = z_text.shape[1] * z_video.shape[1]
    if pairs > torch.iinfo(torch.int16).max:
        raise ValueError(f"K_p·K_p' = {pairs} sample pairs exceed the int16 pair index")
    strip_elements = checks.integer(strip_elements, "strip_elements", minimum=1)
    text = F.normalize(z_text, dim=2, eps=NORMALIZE_EPS)
    video = F.normalize(z_video, dim=2, eps=NORMALIZE_EPS)
    return _StripDistances.apply(text, video, diagonal_min, strip_elements)
