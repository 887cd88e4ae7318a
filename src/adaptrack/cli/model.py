"""The flags of ``generate``, ``serve`` and ``demo`` that say which model to load and how:
those of ``adaptrack eval``'s tasks (:func:`adaptrack.eval.taskspec.loading_options`, where
they are written once)."""

from __future__ import annotations

import argparse

from ..eval.taskspec import loading_options
from .common import positive_int
from .eval import add_option

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
    for option in loading_options(auto, auto=auto, purpose=purpose):
        add_option(parser, option)
    if threads:
        parser.add_argument("--threads", type=positive_int, metavar="N",
                            help="CPU threads for the model (default: the backend's)")
