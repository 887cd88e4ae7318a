"""The flags of every subcommand that loads a model (``generate``, ``serve``, ``demo``):
which model and how it loads, written once."""

from __future__ import annotations

import argparse

from ..lm.load import BACKENDS, DEVICES, DTYPES
from .common import positive_int

__all__ = ["add_model_arguments"]


def add_model_arguments(parser: argparse.ArgumentParser, *, threads: bool = False,
                        purpose: str = "", auto: str | None = "auto") -> None:
    """``--model``, ``--backend``, ``--device`` and ``--dtype`` (the arguments of
    :func:`adaptrack.load_model`, each ``auto`` by default), and ``--threads`` with
    ``threads``; ``purpose`` ends each help line (``" for the model demo"``). ``auto``: the
    parsed value of a choice left out (None, where a command must tell a flag given from
    one left out; it then loads with ``"auto"`` itself).

    >>> parser = argparse.ArgumentParser()
    >>> add_model_arguments(parser)
    >>> args = parser.parse_args(["--device", "cpu"])
    >>> args.model, args.backend, args.device, args.dtype
    (None, 'auto', 'cpu', 'auto')
    """
    parser.add_argument("--model", metavar="SPEC",
                        help=f"a .gguf path, a Hugging Face model id or a local model "
                             f"directory{purpose} (default: the default model, see "
                             "`adaptrack setup`)")
    parser.add_argument("--backend", choices=BACKENDS, default=auto,
                        help=f"model backend{purpose} (default: auto: llama.cpp for a .gguf "
                             "when installed)")
    parser.add_argument("--device", choices=DEVICES, default=auto,
                        help=f"device{purpose} (default: auto: CUDA when available)")
    parser.add_argument("--dtype", choices=DTYPES, default=auto,
                        help=f"weight precision{purpose}, transformers only (default: auto: "
                             "float16 on CUDA, float32 on a CPU; bfloat16 is about 1.9x faster "
                             "on CPUs with AVX-512 BF16 and samples a nearby model; float16 is "
                             "slow on a CPU)")
    if threads:
        parser.add_argument("--threads", type=positive_int, metavar="N",
                            help="CPU threads for the model (default: the backend's)")
