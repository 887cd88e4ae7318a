"""Constraints: what text is valid (docs/design.md §4). Every method takes any of them."""

from collections.abc import Iterable

from .api import API_TERMINATORS, ApiNames, api_names, from_module
from .base import DONE, Anything, Constraint, Matcher, State
from .choice import Choice, choice
from .compose import AllOf, all_of
from .ebnf import ebnf
from .grammar import Grammar, gbnf, json_schema, lark, regex
from .predicate import Predicate, predicate
from .python import HUMANEVAL_STOP, Python, python


def anything(terminators: str | bytes | None = None, stop: Iterable[str] = ()) -> Anything:
    """No constraint (what ``method="unconstrained"`` decodes with); with ``stop``, a
    sequence ends where one of these strings appears, and its text is cut before it.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"\\n", b"<eos>"], lambda prefix: [4, 1, 0], eos=2)
    >>> res = at.generate(lm, [], anything(stop=["\\n"]), method="unconstrained", n=3, seed=0)
    >>> [(s.text, s.tokens) for s in res.samples]    # cut before the stop string
    [('', (1,)), ('aaaa', (0, 0, 0, 0, 1)), ('', (1,))]
    """
    return Anything(terminators, stop)


__all__ = [
    "API_TERMINATORS",
    "DONE",
    "HUMANEVAL_STOP",
    "AllOf",
    "Anything",
    "ApiNames",
    "Choice",
    "Constraint",
    "Grammar",
    "Matcher",
    "Predicate",
    "Python",
    "State",
    "all_of",
    "anything",
    "api_names",
    "choice",
    "ebnf",
    "from_module",
    "gbnf",
    "json_schema",
    "lark",
    "predicate",
    "python",
    "regex",
]
