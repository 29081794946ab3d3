"""Command line: python -m evidential_ops {bench,train,eval,demo,abstain} ...

bench  times forward + backward of each method's loss for every available backend against
       plain PyTorch (eager and torch.compile) and the matrix-product floor, in one run.
train  trains a method (--method tcl|tcvse|uml|fume|duq) on the built-in data or on precomputed
       features (--data DIR); writes checkpoint.pt, metrics.json and PNG plots to --out.
eval   evaluates a checkpoint (--checkpoint PATH) on its data's test split.
demo   the README's main job: train --method M (or all) on the built-in data with the fused
       loss, evaluate, plot, and time the fused loss against plain PyTorch.
abstain calibrates a checkpoint's score (--score u, ...) at a guaranteed error rate and answers
       held-out queries or abstains.
"""

from __future__ import annotations

import argparse
import sys


from . import available_backends, build_info
from .benchmark import LOSS_CASES, compare, device_name, format_table
from .pipelines.abstain_cli import add_abstain_subcommand
from .pipelines.cli import HelpFormatter, add_subcommands, at_least, device_option


def _bench(args) -> int:
    print(f"backends: {available_backends()}  ({build_info()}; {device_name(args.device)})")
    results = compare(sizes=args.sizes, d=args.dim, cases=args.cases, repeats=args.repeats, device=args.device)
    print(format_table(results))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evidential_ops", description=__doc__,
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", formatter_class=HelpFormatter, help="speed of the fused losses against plain PyTorch")
    p.add_argument("--sizes", type=at_least(2), nargs="+", default=[1024], help="batch sizes K")
    p.add_argument("--dim", type=at_least(1), default=512, help="embedding size D")
    p.add_argument("--cases", nargs="+", default=list(LOSS_CASES), choices=list(LOSS_CASES), help="losses to time")
    p.add_argument("--repeats", type=at_least(1), default=3, help="timed rounds per case (the median is reported)")
    p.add_argument("--device", type=device_option, default="cpu", help="torch device of the inputs")
    p.set_defaults(run=_bench)
    add_subcommands(sub)
    add_abstain_subcommand(sub)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
