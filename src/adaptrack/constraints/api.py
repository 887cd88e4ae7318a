"""API-name constraints: the completion is ``prefix`` + an existing dotted name + a terminator.

This is the paper's setting ("only APIs that exist in your version"): after ``tf`` the model
may write ``.math.reduce_sum(`` but not ``.math.reduce_summ(``. :func:`api_names` builds the
constraint from a list of names; :func:`from_module` lists the names an importable module
really has.

The terminator is any ASCII byte that cannot continue a dotted identifier
(:data:`API_TERMINATORS`: everything in 0x00-0x7F except ``A-Z a-z 0-9 _ .``), so
``reduce_sum(``, ``reduce_sum)`` and ``reduce_sum\\n`` all end the name. Bytes from 0x80 up are
*not* terminators: they can continue a Unicode identifier. A token that holds a terminator
completes the sequence, and what the token carries after the terminator is cut off the
sample's ``text`` (:func:`adaptrack.generate` does that).
"""

from __future__ import annotations

import importlib
import numbers
import pkgutil
import sys
import time
import types
import warnings
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..errors import ModuleImportError
from .base import show, terminator_bytes, utf8
from .choice import Choice

_IDENT_BYTES = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_."
)

#: Every ASCII byte that cannot continue a dotted identifier (64 bytes).
API_TERMINATORS: bytes = bytes(b for b in range(0x80) if b not in _IDENT_BYTES)

#: Subpackages found only on disk (not already attributes) with these names are not imported
#: by :func:`from_module`: they are test suites, not API, and importing them has side effects.
SKIPPED_SUBMODULES = frozenset({"tests", "test", "conftest", "setup", "testing_utils"})


def check_name(name: str) -> str:
    """Return ``name`` if it is a dotted Python name (``linalg.norm``), else raise ValueError.

    >>> check_name("linalg.norm")
    'linalg.norm'
    >>> check_name("linalg..norm")
    Traceback (most recent call last):
    ...
    ValueError: 'linalg..norm' is not a dotted Python name: part 2 ('') is not an identifier
    """
    if not isinstance(name, str):
        raise TypeError(f"API names must be strings, got {name!r} ({type(name).__name__})")
    if not name:
        raise ValueError("API names must not be empty")
    for i, part in enumerate(name.split("."), 1):
        if not part.isidentifier():
            raise ValueError(
                f"{name!r} is not a dotted Python name: part {i} ({part!r}) is not an identifier"
            )
    return name


def _check_prefix(prefix: str) -> str:
    """``prefix`` if it is text UTF-8 can encode, else a TypeError/ValueError naming it."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix takes a string (\".\" or \"\"), got {show(prefix)} "
                        f"({type(prefix).__name__})")
    utf8(prefix, "prefix")
    return prefix


def _names(names: Iterable[str], what: str) -> list[str]:
    """The checked ``names``; a single string or a non-iterable is a TypeError."""
    if isinstance(names, str | bytes):
        raise TypeError(f"{what} takes a list of names, got the single string {show(names)}: "
                        f"pass [{show(names)}]")
    try:
        items = list(names)
    except TypeError:
        raise TypeError(f"{what} takes a list of names (strings), got {show(names)} "
                        f"({type(names).__name__})") from None
    return [check_name(n) for n in items]


def api_names(
    names: Iterable[str],
    *,
    prefix: str = ".",
    terminators: str | bytes | Iterable[str] | None = API_TERMINATORS,
) -> Choice:
    """The constraint "``prefix`` + one of ``names`` + one terminator byte".

    ``names`` are dotted Python names relative to the module the prompt ends with (for a
    prompt ending in ``tf``: ``"math.reduce_sum"``). Each must be non-empty and every dotted
    part an identifier (ValueError naming the bad one otherwise). ``terminators`` defaults
    to :data:`API_TERMINATORS`; pass ``None`` to end sequences with EOS instead.

    >>> from adaptrack import TableLM
    >>> lm = TableLM([b".", b"norm", b"norm(x)", b"linalg", b".n", b"<eos>"],
    ...              lambda p: [1] * 6, eos=5)
    >>> m = api_names(["linalg.norm", "norm"]).bind(lm.vocab)
    >>> m.allowed(m.start()).tolist()  # "." and ".n"
    [0, 4]
    >>> s = m.advance(m.start(), 0)
    >>> m.allowed(s).tolist(), m.finishing(s).tolist()  # "norm(x)" ends the name
    ([1, 2, 3], [2])
    >>> m.accepts([0, 2]), m.accepts([0, 1, 5])
    (True, False)
    >>> api_names(["norm", "2d"])
    Traceback (most recent call last):
    ...
    ValueError: '2d' is not a dotted Python name: part 1 ('2d') is not an identifier
    """
    checked = _names(names, "api_names")
    _check_prefix(prefix)
    if not checked:
        raise ValueError("api_names needs at least one name, got none")
    return Choice([prefix + n for n in checked], terminator_bytes(terminators))


class ApiNames(Choice):
    """An :func:`api_names` constraint that remembers where its names came from.

    ``names``: the sorted dotted names relative to ``module`` (``"linalg.norm"``);
    ``errors``: ``(module name, one-line error)`` for every submodule that could not be
    imported or listed, and for a time limit that cut the listing short.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        module: str = "",
        errors: Iterable[tuple[str, str]] = (),
        prefix: str = ".",
        terminators: str | bytes | Iterable[str] | None = API_TERMINATORS,
    ) -> None:
        self.names: list[str] = sorted(set(_names(names, "ApiNames")))
        self.module = module
        self.errors: list[tuple[str, str]] = list(errors)
        self.prefix = _check_prefix(prefix)
        super().__init__([prefix + n for n in self.names], terminator_bytes(terminators))

    def __repr__(self) -> str:
        return (f"ApiNames(module={self.module!r}, {len(self.names)} names, "
                f"{len(self.errors)} errors)")


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _public(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not name.startswith("_")


def _import_root(module: str) -> Any:
    """``importlib.import_module(module)``, its failure as a one-line
    :class:`~adaptrack.errors.ModuleImportError` naming the module."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module + ".").startswith(err.name + "."):
            raise ModuleImportError(f"from_module: no module named {err.name!r} is installed "
                                    f"(check the name of {module!r}, or pip install its "
                                    "package)") from None
        raise ModuleImportError(f"from_module: importing {module!r} failed: {err}") from err
    except Exception as err:  # the module's own code raised while importing
        raise ModuleImportError(f"from_module: importing {module!r} raised "
                                f"{type(err).__name__}: {err}") from err


def from_module(
    module: str | types.ModuleType,
    *,
    max_depth: int = 3,
    time_limit: float = 30.0,
    prefix: str = ".",
    terminators: str | bytes | Iterable[str] | None = API_TERMINATORS,
) -> ApiNames:
    """The public names an importable module really has, as an :class:`ApiNames` constraint.

    What is listed, for the module and (breadth first) each submodule up to ``max_depth``
    dots below it (``max_depth=0``: the module's own attributes only):

    * the public attributes (no leading underscore). A module that defines ``__all__``
      declares its API there, so its names are the entries of ``__all__`` that exist, plus
      its submodules; otherwise every public name in ``dir(module)`` counts (generated API
      modules such as TensorFlow's consist of imports only);
    * attributes that are modules are listed and entered only when they belong to the same
      top-level package (``__name__`` is the root package or starts with it and a dot);
      other modules (``os``, ``sys`` imported by an implementation) are not API and skipped;
    * public submodules found on disk with :func:`pkgutil.iter_modules` are imported (with
      warnings silenced) and listed too, except test suites (:data:`SKIPPED_SUBMODULES`).

    Each module object is entered once, under the first (shortest) path that reaches it;
    other paths to it (aliases, import cycles) list the name but not its contents again, so
    cycles cannot recurse. Failures never stop the listing: a submodule whose import or
    attribute access raises is left out and reported in ``.errors``, and when
    ``time_limit`` seconds have passed the listing stops with what it has and says so in
    ``.errors`` (an import that is under way is not interrupted). A root module that cannot
    be imported raises :class:`~adaptrack.errors.ModuleImportError` (an ImportError); a
    relative or empty name (``"."``, ``".json"``, ``"json."``) is a ValueError, since there
    is no package to resolve it against.
    ``time_limit`` may be ``math.inf`` (no limit).

    >>> c = from_module("json")
    >>> [n for n in c.names if n.startswith(("dump", "decoder.JSONDe"))]
    ['decoder.JSONDecodeError', 'decoder.JSONDecoder', 'dump', 'dumps']
    >>> c.strings[:2], c.errors
    ([b'.JSONDecodeError', b'.JSONDecoder'], [])
    >>> from_module(".")
    Traceback (most recent call last):
    ...
    ValueError: from_module takes an absolute module name such as 'numpy.linalg', got '.' ...
    """
    _check_arguments(module, max_depth, time_limit)
    _check_prefix(prefix)
    terminators = terminator_bytes(terminators)
    deadline = time.monotonic() + time_limit
    errors: list[tuple[str, str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = _import_root(module) if isinstance(module, str) else module
        if not isinstance(root, types.ModuleType):
            # sys.modules may hold any object under a name (a lazy-module shim, say).
            raise TypeError(f"from_module takes a module or a module name, got {show(module)}, "
                            f"which imports as {type(root).__name__}, not a module")
        top = root.__name__.split(".")[0]

        def belongs(obj: types.ModuleType) -> bool:
            name = getattr(obj, "__name__", None)
            return isinstance(name, str) and (name == top or name.startswith(top + "."))

        names: set[str] = set()
        entered = {id(root)}
        queue: deque[tuple[types.ModuleType, str, int]] = deque([(root, "", 0)])
        while queue:
            mod, rel, depth = queue.popleft()
            if time.monotonic() > deadline:
                left = [m.__name__ for m, _, _ in queue]
                errors.append((mod.__name__, f"time limit of {time_limit:g} s reached; this "
                               f"module and {len(left)} more were not listed"))
                break
            for attr, value in _members(mod, errors, deadline):
                full = f"{rel}.{attr}" if rel else attr
                if isinstance(value, types.ModuleType):
                    if not belongs(value):
                        continue
                    if depth < max_depth and id(value) not in entered:
                        entered.add(id(value))
                        queue.append((value, full, depth + 1))
                names.add(full)
    return ApiNames(names, module=root.__name__, errors=errors, prefix=prefix,
                    terminators=terminators)


def _check_arguments(module: str | types.ModuleType, max_depth: int, time_limit: float) -> None:
    """:func:`from_module`'s checks of its arguments (the error contract's messages)."""
    if isinstance(module, str):
        if not all(module.split(".")):
            raise ValueError(
                f"from_module takes an absolute module name such as 'numpy.linalg', got "
                f"{show(module)} (a relative or empty name has no package to resolve against)")
    elif not isinstance(module, types.ModuleType):
        raise TypeError(f"from_module takes a module or a module name, got {show(module)} "
                        f"({type(module).__name__})")
    if isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral):
        raise TypeError(f"max_depth takes an int >= 0, got {show(max_depth)} "
                        f"({type(max_depth).__name__})")
    if max_depth < 0:
        raise ValueError(f"max_depth takes an int >= 0, got {max_depth}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, numbers.Real):
        raise TypeError(f"time_limit takes seconds > 0 (a number), got {show(time_limit)} "
                        f"({type(time_limit).__name__})")
    if not time_limit > 0:  # NaN too: no deadline would ever pass
        raise ValueError(f"time_limit takes seconds > 0 (math.inf: no limit), got {time_limit}")

def _full_name(mod: types.ModuleType, sub: str) -> str:
    return f"{mod.__name__}.{sub}"


def _members(
    mod: types.ModuleType, errors: list[tuple[str, str]], deadline: float
) -> list[tuple[str, object]]:
    """The public (name, value) pairs of ``mod``, its on-disk submodules imported."""
    declared = getattr(mod, "__all__", None)
    try:
        listed = sorted({str(n) for n in declared}) if declared is not None else None
    except TypeError:
        listed = None
    try:
        present = [n for n in dir(mod) if _public(n)]
    except Exception as err:
        errors.append((mod.__name__, f"dir() failed: {_one_line(err)}"))
        present = []
    out: dict[str, object] = {}
    for attr in present if listed is None else sorted(set(present) | set(listed)):
        if not _public(attr):
            continue
        try:
            value = getattr(mod, attr)
        except Exception as err:  # a lazy attribute whose import fails: it is not there
            if listed is not None and attr in listed and hasattr(mod, "__path__"):
                # ``__all__`` may name submodules not imported yet (``email``): import them.
                value = _import(_full_name(mod, attr), errors)
                if value is None:
                    continue
            else:
                if listed is None or attr in listed:
                    errors.append((_full_name(mod, attr), _one_line(err)))
                continue
        if listed is not None and attr not in listed and not isinstance(value, types.ModuleType):
            continue  # __all__ declares the API; other non-module attributes are imports
        out[attr] = value
    path = getattr(mod, "__path__", None)
    if path is not None:
        try:
            found = sorted(info.name for info in pkgutil.iter_modules(list(path)))
        except Exception as err:
            errors.append((mod.__name__, f"listing submodules failed: {_one_line(err)}"))
            found = []
        for sub in found:
            if sub in out or not _public(sub) or sub in SKIPPED_SUBMODULES:
                continue
            if time.monotonic() > deadline:
                errors.append((_full_name(mod, sub), "time limit reached before importing it"))
                continue
            value = _import(_full_name(mod, sub), errors)
            if value is not None:
                out[sub] = value
    return sorted(out.items())


def _import(name: str, errors: list[tuple[str, str]]) -> types.ModuleType | None:
    """Import a submodule; a failure (even ``SystemExit``) is recorded, never raised."""
    try:
        return sys.modules.get(name) or importlib.import_module(name)
    except (Exception, SystemExit) as err:
        errors.append((name, _one_line(err)))
        return None
