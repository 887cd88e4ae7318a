"""The registry of sampling methods (docs/design.md §4, methods): each method is one class
(a :class:`~adaptrack.sampling.base.Method`) that declares its name, whether it searches,
whether it is forward-only and its own options; everything else (``SamplingOptions``, the
command line, the server, ``generate``) reads those declarations here. Adding a method is
its module and one line of :data:`METHODS`, or :func:`register` for one defined elsewhere.

>>> list(METHODS)
['unconstrained', 'cd', 'asap', 'adaptrack', 'exact']
>>> [name for name, m in METHODS.items() if m.searches]
['asap', 'adaptrack', 'exact']
>>> foreign_options("cd", ["max_backtrack", "n"]), owners("share_q")
(['max_backtrack'], ['adaptrack'])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .adaptrack import AdapTrack
from .asap import ASAp
from .base import Method
from .cd import ConstrainedDecoding
from .exact import Exact
from .tree import PrefixTree
from .unconstrained import Unconstrained

#: Every method by name, in the order the help lists them.
METHODS: dict[str, type[Method]] = {
    m.name: m for m in (Unconstrained, ConstrainedDecoding, ASAp, AdapTrack, Exact)
}


def register(method: type[Method]) -> type[Method]:
    """Add ``method`` to :data:`METHODS` under its ``name`` (a ``ValueError`` if the name is
    empty or taken); returns it, so it can decorate the class.

    >>> class Greedy(ConstrainedDecoding):
    ...     name = "greedy-cd"
    >>> register(Greedy) is Greedy and "greedy-cd" in METHODS
    True
    >>> register(Greedy)
    Traceback (most recent call last):
    ValueError: a method named 'greedy-cd' is already registered
    >>> del METHODS["greedy-cd"]
    """
    if not method.name:
        raise ValueError(f"{method.__name__} declares no name")
    if method.name in METHODS:
        raise ValueError(f"a method named {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def owners(option: str) -> list[str]:
    """The methods that declare ``option`` as their own (none: every method reads it)."""
    return [name for name, m in METHODS.items() if option in m.options]


def foreign_options(method: str, given: Iterable[str]) -> list[str]:
    """Of the options ``given`` (those set to other than their default), the ones only other
    methods read: an error for ``method`` (the names in the order given)."""
    own = METHODS[method].options
    return [o for o in given if o not in own and owners(o)]


def build(method: str, tree: PrefixTree, greedy: bool, options: Any) -> Method:
    """The method named ``method`` over ``tree``, with its own options read from
    ``options`` (a ``SamplingOptions``) as keywords."""
    cls = METHODS[method]
    return cls(tree, greedy, **{name: getattr(options, name) for name in cls.options})
