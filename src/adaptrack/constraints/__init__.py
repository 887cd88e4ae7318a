"""Constraints: what text is valid (design.md §4). Every method takes any of them."""

from .base import DONE, Anything, Constraint, Matcher, State
from .choice import Choice, choice


def anything(terminators: str | bytes | None = None) -> Anything:
    """No constraint (what ``method="unconstrained"`` decodes with)."""
    return Anything(terminators)


__all__ = ["DONE", "Anything", "Choice", "Constraint", "Matcher", "State", "anything", "choice"]
