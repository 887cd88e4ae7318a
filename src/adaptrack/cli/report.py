"""``adaptrack report``: tables and plots from an ``adaptrack eval`` results file."""

from __future__ import annotations

import argparse
import sys

HELP = "tables and plots from an `adaptrack eval` results file"
DESCRIPTION = ("Markdown tables shaped like the paper's (Tables 1 and 5 for tfv1, Table 4 for "
               "binary and dsl, Table 3 for humaneval and mbpp) and PNG plots (EM@k for tfv1, "
               "KL over sliding windows for binary and dsl).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS.jsonl")
    parser.add_argument("--plots", metavar="DIR",
                        help="write PNG plots into DIR (tfv1, binary and dsl results; needs "
                             "matplotlib)")
    parser.add_argument("--methods", metavar="M1,M2",
                        help="report these methods' records only (a report compares the "
                             "problems every method in it finished)")


def run(args: argparse.Namespace) -> int:
    from ..eval.report import report

    methods = args.methods.split(",") if args.methods else None
    print(report(args.results, plots=args.plots, methods=methods), file=sys.stdout)
    return 0
