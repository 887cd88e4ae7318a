"""Unconstrained sampling: ancestral sampling from the model (top-p as plain nucleus;
docs/design.md §3).

It is greedy CD over a tree whose matcher allows every token and whose length limit only
stops the walk (``generate`` builds that tree), so the walk itself is CD's.
"""

from __future__ import annotations

from .cd import ConstrainedDecoding
from .tree import PrefixTree


class Unconstrained(ConstrainedDecoding):
    """Ancestral sampling: CD's walk over a tree that constrains nothing.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"<eos>"], lambda prefix: [1, 1], eos=1)
    >>> opts = at.sampling.TreeOptions(restrict_length=False)
    >>> tree = PrefixTree([], at.constraints.Anything().bind(lm.vocab), opts)
    >>> Unconstrained(tree, greedy=False).greedy
    False
    """

    name = "unconstrained"
    constrained = False

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """Sampling over ``tree`` (built with an ``Anything`` matcher and
        ``restrict_length=False``); ``greedy``: take the argmax (temperature 0)."""
        super().__init__(tree, greedy)
