"""``adaptrack demo``: the methods side by side on the default (or a given) model, or on a
toy problem against the exact target (``--problem``); the work is in
:mod:`adaptrack.demo`."""

from __future__ import annotations

import argparse
import sys

from .. import testing
from .common import UsageError, non_negative_int, positive_int
from .model import add_model_arguments

HELP = "compare CD, ASAp, AdapTrack and exact sampling"
DESCRIPTION = ("Compare the methods on the default (or given) model: the paper's Figure 3 and "
               "the five-bit task against its exact target; with --problem, on a toy problem "
               "against the exact target distribution.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problem", choices=sorted(testing.PROBLEMS),
                        help="run a toy problem instead of the real-model demo")
    parser.add_argument("-n", "--samples", type=positive_int,
                        help="samples per method (default: 10 for the model demo's Figure 3, "
                             "2000 for a toy problem)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="random seed, >= 0 (default: 0)")
    add_model_arguments(parser, purpose=" for the model demo", auto=None)


def run(args: argparse.Namespace) -> int:
    # Imported here: monkeypatching adaptrack.demo (tests) and a fast --help both need it.
    from .. import demo

    if args.problem is not None:
        given = [f"--{k}" for k in ("model", "backend", "device", "dtype") if getattr(args, k)]
        if given:
            raise UsageError(f"{', '.join(given)} apply to the model demo (without --problem)")
        # out= explicitly: demo's default is bound to the sys.stdout of import time
        demo.run_demo(args.problem, args.samples or 2000, args.seed, out=sys.stdout)
        return 0
    demo.run_model_demo(model=args.model, backend=args.backend or "auto",
                        device=args.device or "auto", dtype=args.dtype or "auto",
                        n=args.samples or 10, seed=args.seed, out=sys.stdout)
    return 0
