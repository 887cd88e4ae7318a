"""Constraints: what text is valid (docs/design.md §4). Every method takes any of them."""

from .api import API_TERMINATORS, ApiNames, api_names, from_module
from .base import DONE, Anything, Constraint, Matcher, State
from .choice import Choice, choice
from .compose import AllOf, all_of
from .grammar import Grammar, gbnf, json_schema, lark, regex
from .predicate import Predicate, predicate
from .python import HUMANEVAL_STOP, Python, python


def anything(terminators: str | bytes | None = None) -> Anything:
    """No constraint (what ``method="unconstrained"`` decodes with)."""
    return Anything(terminators)


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
    "from_module",
    "gbnf",
    "json_schema",
    "lark",
    "predicate",
    "python",
    "regex",
]
