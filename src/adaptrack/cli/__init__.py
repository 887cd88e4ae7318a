"""The ``adaptrack`` command: argument parsing and printing only, one module per command
(``setup``, ``generate``, ``demo``, ``eval``, ``report``, ``bench``, ``serve``), each with
``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> int``.

Every user error ends in one ``adaptrack: error: ...`` line on stderr and exit status 2;
numeric options are checked while parsing, before any model is loaded.

>>> args = build_parser().parse_args(["demo", "--problem", "binary", "-n", "5"])
>>> args.command, args.samples, args.run is demo.run
('demo', 5, True)
>>> main(["generate", "--prompt", "a", "--seed", "-5"])  # stderr: one line naming --seed
2
"""

from __future__ import annotations

import os
import sys

from .. import __version__
from ..errors import AdaptrackError
from . import bench, demo, generate, report, serve, setup
from . import eval as eval_
from .common import USAGE_ERROR, Parser, UsageError, one_line

__all__ = ["COMMANDS", "build_parser", "main"]

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (setup, generate, demo, eval_, report, bench, serve)


def build_parser() -> Parser:
    """The ``adaptrack`` parser: one subcommand per module of :data:`COMMANDS`."""
    parser = Parser(prog="adaptrack",
                    description="Constrained decoding without distorting the model.")
    parser.add_argument("--version", action="version", version=f"adaptrack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS:
        command = sub.add_parser(module.__name__.rpartition(".")[2], help=module.HELP,
                                 description=module.DESCRIPTION)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``adaptrack`` command; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        try:
            return int(args.run(args))
        except (AdaptrackError, ValueError) as err:  # the library's errors say how to fix them
            raise UsageError(one_line(err)) from None
    except UsageError as err:
        print(f"adaptrack: error: {one_line(err)}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    except KeyboardInterrupt:
        print("adaptrack: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `adaptrack ... | head`: stop quietly, like other tools
        try:  # so that the interpreter's final flush of stdout does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
