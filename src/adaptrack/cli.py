"""The ``adaptrack`` command: argument parsing and printing only."""

from __future__ import annotations

import argparse
import sys

from . import __version__, toy
from .errors import AdaptrackError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="adaptrack", description="Constrained decoding without distorting the model."
    )
    parser.add_argument("--version", action="version", version=f"adaptrack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="CD vs ASAp vs AdapTrack vs exact on a toy problem")
    demo.add_argument("--problem", choices=sorted(toy.PROBLEMS), default="binary")
    demo.add_argument("-n", "--samples", type=int, default=2000, help="samples per method")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            if args.samples < 1:
                parser.error("--samples must be at least 1")
            from .demo import run_demo

            run_demo(args.problem, args.samples, args.seed)
    except AdaptrackError as err:
        print(f"adaptrack: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
