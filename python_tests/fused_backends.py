"""Which fused backends the backend-parametrised suite runs, and what each one is tested with.

A backend joins the suite by registering (evidential_ops.backends): every fused backend that
`eo.available_backends()` lists gets a `FusedCase`. What differs between backends is only where
their tensors live and which sizes and dtypes they can be tested with here (the Triton
interpreter, for instance, runs float32 only and slowly): the tests themselves are shared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import evidential_ops as eo
from evidential_ops.triton_backend import configs

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class FusedCase:
    """One fused backend under test.

    device: where its input tensors live. dtypes: input dtypes it is tested with.
    max_k: the largest K the suite gives it (tests with larger sizes shrink or skip).
    realistic: (K, D) of the realistic-size accuracy test.
    products: whose float32 matmul forms its tile products: "torch", or "numpy" for Triton's
        interpreter (its tl.dot), which rounds differently on some machines.
    variant: "" or "tiles": Triton with float32 embeddings' s from its tile kernels, as traced
        graphs take it, instead of the cuBLAS strips eager launches take
        (launch.similarity_strips; the `fused` fixtures that ask for variants apply it).
    """

    name: str
    device: torch.device
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    max_k: int = 4096
    realistic: tuple[int, int] = (1024, 512)
    products: str = "torch"
    variant: str = ""

    def __str__(self) -> str:  # pytest ids
        return f"{self.name}-{self.variant}" if self.variant else self.name


def _case(name: str) -> FusedCase | None:
    if name == "cpu":
        return FusedCase("cpu", torch.device("cpu"))
    if name == "cuda":
        return FusedCase("cuda", torch.device("cuda")) if torch.cuda.is_available() else None
    if name == "triton":
        if torch.cuda.is_available():
            return FusedCase("triton", torch.device("cuda"))
        if configs.interpreting():  # the interpreter: CPU tensors, float32, small K
            return FusedCase("triton", torch.device("cpu"), dtypes=(torch.float32,), max_k=160, realistic=(160, 203),
                             products="numpy")
        return None
    raise AssertionError(f"no test case for fused backend {name!r}: add one here")


def fused_cases(tile_variants: bool = False) -> list[FusedCase]:
    """Every registered fused backend that can run on this machine; with `tile_variants`, Triton's
    interpreter case again as "tiles" (float32 and 16-bit embeddings take cuBLAS strips of s in
    eager launches, so its tile kernels' products would otherwise run here only in the tests that
    force them)."""
    cases = [case for case in (_case(name) for name in eo.available_backends() if name != "reference") if case]
    if tile_variants:
        cases += [replace(case, variant="tiles") for case in cases
                  if case.name == "triton" and case.device.type == "cpu"]
    return cases


def use_case(case: FusedCase, monkeypatch) -> FusedCase:
    """Applies the case's variant for one test (monkeypatch undoes it) and returns the case."""
    if case.variant == "tiles":
        from evidential_ops.triton_backend import launch

        monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 1 << 30)
        monkeypatch.setattr(launch, "SIMILARITY_STRIPS_ABOVE_D", 1 << 30)
        monkeypatch.setattr(launch, "HALF_SIMILARITY_STRIPS_ABOVE_D", 1 << 30)
    return case


def run(fn, inputs, upstream):
    """Per-line losses and the gradient of Σ upstream·losses w.r.t. each input."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    rows, cols = fn(*leaves)
    total = sum((part * w.to(part)).sum() for part, w in zip((rows, cols), upstream) if part.numel())
    grads = torch.autograd.grad(total, leaves)
    return rows.detach(), cols.detach(), grads
