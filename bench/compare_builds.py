"""Time the same fused loss in two builds of evidential_ops, alternating, in one run.

    python bench/compare_builds.py --before /path/to/old/checkout --after . --k 4096 --rounds 4

Each measurement is a fresh process (one build imported per process), and the builds alternate
(before, after, before, after, ...) so that the drift of a shared machine hits both alike. Each
process times forward + backward of the TCL, UML and DUQ losses (CPU, float32, D = 512) and
reports the fastest of `--repeats` calls after a warm-up. Prints one table of the medians over
rounds and the after/before ratio per loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
import torch.nn.functional as F
import evidential_ops as eo
k, d, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cases = {"tcl": dict(evidence="exp", tau=0.05, weights={"risk": 1.0, "kl": 0.1}),
         "uml": dict(evidence="exp_tanh", tau=0.1, weights={"fmse": 1.0, "logdet": -0.01}),
         "duq": dict(evidence="relu", tau=1.0, weights={"mse": 1.0})}
g = torch.Generator().manual_seed(0)
x = F.normalize(torch.randn(k, d, generator=g), dim=1)
y = F.normalize(0.6 * x + 0.8 * F.normalize(torch.randn(k, d, generator=g), dim=1), dim=1)
out = {}
for name, kw in cases.items():
    xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
    def step():
        xx.grad = yy.grad = None
        eo.evidential_loss(xx, yy, backend="cpu", check_finite=False, **kw).backward()
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
    out[name] = min(times)
print(json.dumps(out))
"""


def measure(root: str, k: int, d: int, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(root)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(k), str(d), str(repeats)], env=env,
                          capture_output=True, text=True, check=True, cwd="/")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="checkout with the old build (built in place)")
    parser.add_argument("--after", default=".", help="checkout with the new build (built in place)")
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs = {"before": [], "after": []}
    for round_index in range(args.rounds):
        for label in ("before", "after"):
            result = measure(getattr(args, label), args.k, args.d, args.repeats)
            runs[label].append(result)
            print(f"round {round_index + 1} {label}: " + "  ".join(f"{c} {1e3 * t:.0f} ms" for c, t in result.items()),
                  flush=True)
    print(f"\nK = {args.k}, D = {args.d}: median over {args.rounds} rounds of the fastest of {args.repeats} calls")
    print("| loss | before ms | after ms | after / before |\n|---|---|---|---|")
    for case in runs["before"][0]:
        before = statistics.median(r[case] for r in runs["before"])
        after = statistics.median(r[case] for r in runs["after"])
        print(f"| {case} | {1e3 * before:.0f} | {1e3 * after:.0f} | {after / before:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
