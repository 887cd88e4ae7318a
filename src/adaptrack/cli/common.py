"""What the commands share: the one-line usage error, argument types that reject bad values
at parse time (before any model is loaded), reading text files and stdin, the sampling
options of ``generate`` (flags generated from :class:`~adaptrack.options.SamplingOptions`),
its constraint options, and JSON-safe numbers.

>>> non_negative_int("3"), probability("0.5"), limit("inf")
(3, 0.5, None)
>>> non_negative_float("inf")
Traceback (most recent call last):
argparse.ArgumentTypeError: must be a finite number >= 0, got inf
>>> utf8_text(b"a\\xff".decode("utf-8", "surrogateescape"))
Traceback (most recent call last):
argparse.ArgumentTypeError: is not valid UTF-8 (byte 0xff at character 1)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from .. import constraints
from ..errors import ModuleImportError
from ..flags import NONE_SPELLING, Flag
from ..options import SamplingOptions, option_flags
from ..sampling.methods import METHODS, foreign_options, owners
from ..serve.constraint_spec import ConstraintSpec

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line (its type name when it has none).

    >>> one_line(ValueError("first\\n  second"))
    'first second'
    """
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or (
        type(err).__name__)


# -- argument types: reject bad values before a model is loaded --------------------------


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, counts that may be zero)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a temperature where 0 means greedy)."""
    value = _float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def probability(text: str) -> float:
    """A number in (0, 1] (top-p)."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def walks(text: str) -> bool | int | None:
    """Walks in flight: ``auto`` (None), ``on`` (True), ``off`` (False) or a count >= 1.

    >>> walks("auto"), walks("on"), walks("8")
    (None, True, 8)
    """
    named = {"auto": None, "on": True, "off": False}
    if text in named:
        return named[text]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be auto, on, off or a number >= 1, got {text}")
    return value


def limit(text: str) -> float | None:
    """A budget (seconds, a multiple of CD's calls), > 0; ``inf`` means none (``None``)."""
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (inf for no limit), got {text}")
    return None if math.isinf(value) else value


def _bad_utf8(text: str) -> str | None:
    """Why ``text`` cannot be encoded as UTF-8 (argv and stdin bytes that are not UTF-8
    arrive as lone surrogates), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = text[err.start]
        if 0xDC80 <= ord(char) <= 0xDCFF:  # surrogateescape: the original byte
            return f"byte 0x{ord(char) - 0xDC00:02x} at character {err.start}"
        return f"lone surrogate U+{ord(char):04X} at character {err.start}"
    return None


def utf8_text(text: str) -> str:
    """A command-line string that is valid UTF-8."""
    why = _bad_utf8(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"is not valid UTF-8 ({why})")
    return text


def names(allowed: Iterable[str]) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of names from ``allowed``, in the order given.

    >>> names(("cd", "exact"))("exact, cd")
    ('exact', 'cd')
    """

    def parse(text: str) -> tuple[str, ...]:
        found = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        bad = [n for n in found if n not in allowed]
        if bad or not found:
            raise argparse.ArgumentTypeError(
                f"{bad[0]!r} is not one of {', '.join(allowed)}" if bad else "is empty")
        return found

    parse.__name__ = "list"
    return parse


# -- input ---------------------------------------------------------------------------------


#: The largest file of choices, names, schema or grammar read (``/dev/zero`` is endless).
MAX_TEXT_FILE_BYTES = 64 << 20


def read_text(path: str, what: str, option: str) -> str:
    """The UTF-8 text of ``path`` (``-``: stdin), verbatim; a ``UsageError`` naming
    ``option`` when it cannot be read, is larger than :data:`MAX_TEXT_FILE_BYTES` or is not
    UTF-8."""
    cap = MAX_TEXT_FILE_BYTES
    try:
        if path == "-":
            raw = getattr(sys.stdin, "buffer", None)
            text = (raw.read(cap + 1).decode("utf-8") if raw is not None
                    else sys.stdin.read(cap + 1))
        else:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read(cap + 1)
        if len(text) > cap:
            raise UsageError(f"{option} {path}: larger than {cap >> 20} MiB; a {what} "
                             "is far smaller")
    except OSError as err:
        raise UsageError(f"cannot read {what} {path!r}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        where = "stdin" if path == "-" else f"{what} {path!r}"
        raise UsageError(f"{option} {path}: {where} is not UTF-8 text: {err.reason} at byte "
                         f"{err.start}") from None
    why = _bad_utf8(text)
    if why is not None:
        where = "stdin" if path == "-" else f"{what} {path!r}"
        raise UsageError(f"{option} {path}: {where} is not UTF-8 text ({why})")
    return text


def read_lines(path: str, what: str, option: str) -> list[str]:
    """The non-blank lines of ``path``; a ``UsageError`` when there are none."""
    found = [line for line in read_text(path, what, option).splitlines() if line.strip()]
    if not found:
        raise UsageError(f"{what} {path!r} has no entries (it is empty)")
    return found


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what is printed meanwhile (by Python or by native code) to stderr, so that
    stdout carries only the command's output (``--json``)."""
    sys.stdout.flush()
    saved = None
    try:
        fd = sys.stdout.fileno()
        sys.stderr.flush()
        saved = os.dup(fd)
        os.dup2(sys.stderr.fileno(), fd)
    except (OSError, ValueError, AttributeError):  # no file descriptor (captured, embedded)
        fd = -1
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)


# -- sampling options (generate): one flag per field of SamplingOptions -----------------

#: The argument type of each kind of value a :class:`~adaptrack.flags.Flag` reads
#: (:data:`adaptrack.flags.PARSED`), and an evaluation task's own flags.
PARSERS: dict[str, Callable[[str], Any]] = {
    "count": positive_int, "natural": non_negative_int, "non_negative": non_negative_float,
    "positive": positive_float, "probability": probability, "fraction": fraction,
    "limit": limit, "walks": walks,
}


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`~adaptrack.options.SamplingOptions`, made from its
    :class:`~adaptrack.flags.Flag` (its spelling, help and what it reads), with the
    field's default; :func:`sampling_options` reads them back.

    >>> parser = argparse.ArgumentParser()
    >>> add_sampling_arguments(parser)
    >>> args = parser.parse_args(["--top-p", "0.9", "--no-fast-forward", "--fallback", "none"])
    >>> opts = sampling_options(args)
    >>> opts.top_p, opts.fast_forward, opts.fallback, opts.method
    (0.9, False, None, 'adaptrack')
    """
    for name, flag, default in option_flags():
        add_sampling_argument(parser, name, flag, default, flag.describe(default))


def add_sampling_argument(parser: argparse.ArgumentParser, name: str, flag: Flag,
                          default: Any, help: str) -> None:
    """The flag of the sampling option ``name`` (``flag``) with ``default`` and ``help``:
    ``generate``'s, or an evaluation task's (:class:`~adaptrack.eval.taskspec.Sampling`).
    A choice's names are read now, so a method registered before the parser is made is
    one of them."""
    if flag.reads in ("switch", "negated"):
        parser.add_argument(flag.name, dest=name, help=help, default=default,
                            action="store_true" if flag.reads == "switch"
                            else "store_false")
    elif flag.reads == "choice":
        parser.add_argument(flag.name, dest=name, help=help, choices=list(flag.choices),
                            default="none" if default is None else default)
    else:
        parser.add_argument(flag.name, dest=name, help=help, default=default,
                            type=PARSERS[flag.reads], metavar=flag.metavar)


def sampling_options(args: argparse.Namespace) -> SamplingOptions:
    """The :class:`~adaptrack.options.SamplingOptions` that the flags of
    :func:`add_sampling_arguments` give; a ``UsageError`` naming the flag when they do not
    go together."""
    flags = option_flags()
    values = {name: getattr(args, name) for name, _, _ in flags}
    if values["fallback"] == "none":
        values["fallback"] = None
    spelled = {name: flag.name for name, flag, _ in flags}
    given = [name for name, _, default in flags if values[name] != default]
    foreign = (foreign_options(values["method"], given) if values["method"] in METHODS
               else [])
    if foreign:
        raise UsageError(f"{spelled[foreign[0]]} applies to --method "
                         f"{' or '.join(owners(foreign[0]))} only")
    try:
        return SamplingOptions(**values)
    except (TypeError, ValueError) as err:
        raise UsageError(one_line(err)) from None


def _spelling(flag: Flag, value: Any) -> str:
    if value is None:
        return NONE_SPELLING[flag.reads]
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if isinstance(value, float) else str(value)


def sampling_argv(options: SamplingOptions) -> list[str]:
    """The flags that give ``options`` (those not at their default), the inverse of
    :func:`sampling_options`. ``FastForward(...)`` options have no spelling (a
    ``ValueError``): the command line says only whether to fast-forward.

    >>> sampling_argv(SamplingOptions(method="exact", n=5, max_seconds=None))
    ['--method', 'exact', '-n', '5', '--max-seconds', 'inf']
    """
    argv: list[str] = []
    for name, flag, default in option_flags():
        value = getattr(options, name)
        if type(value) is type(default) and value == default:
            continue
        if flag.reads in ("switch", "negated"):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r} has no command-line spelling")
            argv.append(flag.name)
        else:
            argv += [flag.name, _spelling(flag, value)]
    return argv


# -- constraint options (generate) --------------------------------------------------------

_GRAMMAR_OPTIONS = ("api_names", "api_module", "regex", "json_schema", "lark", "gbnf")


def add_constraint_arguments(parser: argparse.ArgumentParser) -> None:
    """At most one of ``--constraint``/``--choices``, ``--api-names``, ``--api-module``,
    ``--regex``, ``--json-schema``, ``--lark``, ``--gbnf``; and ``--terminators``."""
    kinds = parser.add_argument_group(
        "constraint (at most one; without one the output is unconstrained)"
    ).add_mutually_exclusive_group()
    kinds.add_argument("--constraint", "--choices", metavar="PATH", dest="constraint",
                       help="a file of choices, one string per line (blank lines ignored): "
                            "the output must be one of them")
    kinds.add_argument("--api-names", metavar="PATH",
                       help="a file of dotted API names, one per line: the output is '.' + "
                            "one of them + a character that cannot continue a name, e.g. '('")
    kinds.add_argument("--api-module", metavar="MODULE",
                       help="like --api-names, with the public names of an installed module "
                            "(e.g. numpy): only APIs that exist in your version")
    kinds.add_argument("--regex", metavar="PATTERN", type=utf8_text,
                       help="the output must match PATTERN")
    kinds.add_argument("--json-schema", metavar="PATH",
                       help="the output must be JSON valid under the schema in PATH")
    kinds.add_argument("--lark", metavar="PATH", help="the output must match a Lark grammar")
    kinds.add_argument("--gbnf", metavar="PATH", help="the output must match a GBNF grammar")
    parser.add_argument("--terminators", metavar="CHARS", type=utf8_text,
                        help="characters that end the output, e.g. '(' (kept in the text), "
                             "with --choices or without a constraint; in bash, $'\\n' is a "
                             "newline")


def constraint_from_args(args: argparse.Namespace) -> constraints.Constraint | None:
    """The constraint the options of :func:`add_constraint_arguments` describe."""
    given = [k for k in _GRAMMAR_OPTIONS if getattr(args, k) is not None]
    if given and args.terminators is not None:
        option = "--" + given[0].replace("_", "-")
        raise UsageError(f"--terminators applies to --choices or no constraint, not {option}")
    if args.api_module is not None:
        return _from_module(args.api_module)
    spec = constraint_spec(args)
    if spec is not None:
        return spec.build()
    return None if args.terminators is None else constraints.anything(args.terminators)


def constraint_spec(args: argparse.Namespace) -> ConstraintSpec | None:
    """The constraint given by a file or a pattern, as the server's fields give one
    (``--api-module`` and ``--terminators`` alone are the command line's own)."""
    if args.constraint is not None:
        return ConstraintSpec.strings(
            "choice", read_lines(args.constraint, "constraint file", "--choices"),
            terminators=args.terminators)
    if args.api_names is not None:
        return ConstraintSpec.strings("api_names", [
            line.strip() for line in read_lines(args.api_names, "API names file",
                                                "--api-names")])
    if args.regex is not None:
        return ConstraintSpec("regex", args.regex)
    for kind in ("json_schema", "lark", "gbnf"):
        path = getattr(args, kind)
        if path is not None:
            option = "--" + kind.replace("_", "-")
            return ConstraintSpec(kind, read_text(path, kind.replace("_", " ") + " file",
                                                  option))
    return None


def _from_module(module: str) -> constraints.Constraint:
    try:
        # An imported module may print; stdout is for the result alone.
        with stdout_to_stderr():
            found = constraints.from_module(module)
    except ModuleImportError as err:
        raise UsageError(f"--api-module: {one_line(err).removeprefix('from_module: ')}"
                         ) from None
    except (ImportError, ValueError) as err:
        raise UsageError(f"--api-module: cannot import module {module!r}: {err}") from None
    for where, error in found.errors:
        print(f"adaptrack: warning: {where}: {error}", file=sys.stderr)
    if not found.names:
        raise UsageError(f"module {module!r} has no public names to complete")
    return found


def number(x: Any) -> Any:
    """A JSON-safe number: numpy scalars unwrapped, NaN/inf as null.

    >>> number(float("nan")), number(2)
    (None, 2)
    """
    x = x.item() if hasattr(x, "item") else x
    return None if isinstance(x, float) and not math.isfinite(x) else x
