"""Worst errors of a fused backend against the float64 reference, per term, regime and input dtype.

    python bench/accuracy.py [--backend cpu] [--seed 0] [--out bench/results/accuracy_cpu.md]

The tests assert SPEC §5's tolerances; this prints the measured values, for docs/benchmarks.md and notes.
Losses: max over lines of |got − ref| / max(|ref|, 1e-3) (per-line losses, both directions).
Gradients: max |got − ref| / max |ref| of dx, dy under a random upstream gradient. The reference
runs in float64 on the same (rounded) inputs, so the figures are the backend's own error.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python_tests"), str(ROOT)]  # python_tests first: its conftest, not the root one
import evidential_ops as eo  # noqa: E402
from conftest import hard_pairs, random_pairs  # noqa: E402  (the regimes the tests use)

CASES = [  # (label, keywords)
    ("risk", dict(weights={"risk": 1.0}, evidence="exp", tau=0.05)),
    ("kl", dict(weights={"kl": 1.0}, evidence="exp", tau=0.05)),
    ("mse", dict(weights={"mse": 1.0}, evidence="relu", tau=1.0)),
    ("fmse", dict(weights={"fmse": 1.0}, evidence="exp_tanh", tau=0.1)),
    ("logdet", dict(weights={"logdet": 1.0}, evidence="exp_tanh", tau=0.1)),
    ("tcl risk+kl", dict(weights={"risk": 1.0, "kl": 1.0}, evidence="exp", tau=0.05)),
    ("all terms, softplus", dict(weights={"risk": 1.0, "kl": 0.1, "mse": 0.5, "fmse": 0.7, "logdet": -0.01},
                                 evidence="softplus", tau=0.05)),
]
REGIMES = {
    "random K=113 D=203": lambda g: random_pairs(113, 203, generator=g, dtype=torch.float64),
    "hard K=113 D=203": lambda g: hard_pairs(113, 203, generator=g, dtype=torch.float64),
    "hard K=1024 D=512": lambda g: hard_pairs(1024, 512, generator=g, dtype=torch.float64),
}


def losses_and_grads(fn, x, y, upstream):
    leaves = [x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()]
    rows, cols = fn(*leaves)
    total = (rows.double() * upstream[0]).sum() + (cols.double() * upstream[1]).sum()
    return torch.cat([rows.detach(), cols.detach()]).double(), torch.autograd.grad(total, leaves)


def errors(backend: str, x64, y64, dtype, keywords, generator):
    k = x64.shape[0]
    upstream = torch.rand(2, k, dtype=torch.float64, generator=generator)
    x, y = x64.to(dtype), y64.to(dtype)
    got, got_grads = losses_and_grads(
        lambda a, b: eo.evidential_loss(a, b, backend=backend, reduction="none", **keywords), x, y, upstream)
    ref, ref_grads = losses_and_grads(
        lambda a, b: eo.reference.evidential_loss(a.double(), b.double(), reduction="none", **keywords),
        x.double(), y.double(), upstream)
    finite = bool(torch.isfinite(got).all()) and all(bool(torch.isfinite(g).all()) for g in got_grads)
    loss_err = float(((got - ref).abs() / ref.abs().clamp_min(1e-3)).max())
    grad_err = max(float((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
                   for g, r in zip(got_grads, ref_grads))
    return loss_err, grad_err, finite


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=[b for b in eo.available_backends() if b != "reference"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    g = torch.Generator().manual_seed(args.seed)
    lines = [f"Backend `{args.backend}` vs the float64 reference (seed {args.seed}): worst loss / gradient error.",
             "", "| regime | terms | float32 loss | float32 grad | bfloat16 loss | bfloat16 grad | float16 loss | float16 grad |",
             "|---|---|---|---|---|---|---|---|"]
    for regime, make in REGIMES.items():
        x64, y64 = make(g)
        for label, keywords in CASES:
            cells = []
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                loss_err, grad_err, finite = errors(args.backend, x64, y64, dtype, keywords, g)
                mark = "" if finite else " (non-finite!)"
                cells += [f"{loss_err:.1e}{mark}", f"{grad_err:.1e}"]
            lines.append(f"| {regime} | {label} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
