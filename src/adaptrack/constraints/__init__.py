"""Constraints: what text is valid (docs/design.md §4). Every method takes any of them."""

from .anything import Anything, anything
from .api import API_TERMINATORS, ApiNames, api_names, from_module
from .base import DONE, Constraint, Matcher, State
from .choice import Choice, choice
from .compose import AllOf, Stopped, all_of, with_stop
from .ebnf import ebnf
from .grammar import Grammar, gbnf, json_schema, lark, regex
from .predicate import Predicate, predicate
from .python import HUMANEVAL_STOP, Python, python

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
    "Stopped",
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
    "with_stop",
]
