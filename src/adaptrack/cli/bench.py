"""``adaptrack bench``: benchmarks whose last stdout line is one JSON object (see
docs/benchmarks/); ``bench ff`` runs :func:`adaptrack.eval.ffbench.bench_ff`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .common import Parser, UsageError, non_negative_int, number, positive_int

HELP = "benchmarks (see docs/benchmarks/)"
DESCRIPTION = "Benchmarks; the last stdout line is one JSON object."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, parser_class=Parser)
    ff = sub.add_parser(
        "ff", help="fast-forward tokens on MaskBench, ours against llguidance's",
        description="Walk the canonical tokenization of every valid MaskBench instance "
                    "(compact JSON) and compare our fast-forward tokens with llguidance's.",
    )
    ff.add_argument("--data", required=True, metavar="FILE",
                    help="MaskBench .jsonl or .jsonl.gz (schema + tests per line)")
    ff.add_argument("--tokenizer", required=True, metavar="DIR",
                    help="a directory holding tokenizer.json (or the file itself)")
    ff.add_argument("--max-tokens", type=non_negative_int, default=4, metavar="K",
                    help="final tokens checked for a spanning token; 0 holds nothing back "
                         "(default: 4)")
    ff.add_argument("--conservative", action="store_true",
                    help="hold back whenever any vocabulary token spans the end (no grammar "
                         "check)")
    ff.add_argument("--limit", type=positive_int, metavar="N",
                    help="walk at most N valid instances")
    ff.add_argument("--no-whitespace", action="store_true",
                    help="grammar without flexible whitespace (llguidance's "
                         "whitespace_flexible=false; default: llguidance's default, flexible)")


def run(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.data):
        raise UsageError(f"cannot read data file {args.data!r}: no such file")
    tokenizer = args.tokenizer
    file = os.path.join(tokenizer, "tokenizer.json") if os.path.isdir(tokenizer) else tokenizer
    if not os.path.isfile(file):
        raise UsageError(f"no tokenizer.json in {tokenizer!r}")
    from ..eval.ffbench import bench_ff

    try:
        result = bench_ff(args.data, tokenizer, max_tokens=args.max_tokens,
                          conservative=args.conservative, limit=args.limit,
                          whitespace_flexible=not args.no_whitespace,
                          progress=sys.stderr.isatty())
    except OSError as err:
        raise UsageError(f"{err.strerror or err}: {err.filename or ''}".strip(": ")) from None
    print(json.dumps({k: number(v) if not isinstance(v, list) else v
                      for k, v in result.items()}, ensure_ascii=False), file=sys.stdout)
    return 0
