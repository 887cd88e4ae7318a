"""Greedy constrained decoding (the AdapTrack paper §3.2): mask invalid tokens, renormalize,
never look back (docs/design.md §3).

P_con(s_i | s_<i) ∝ P(s_i | s_<i) · 1[s_i ∈ C(s_<i)]. It never fails on a constraint with no
dead ends; when it walks into one (a prefix that cannot finish within max_new_tokens) it
returns that prefix as an incomplete sample, as docs/design.md §2 specifies.
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw
from .tree import PrefixTree


class ConstrainedDecoding(Method):
    """Greedy CD: each token from P(· | prefix) restricted to the valid tokens.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree(lm, [], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> ConstrainedDecoding(tree, greedy=True).independent   # samples share only the tree
    True
    """

    forces_chains = True  # CD conditions on its own path anyway: take the fewest calls

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """CD over ``tree``; ``greedy``: take the argmax (temperature 0)."""
        super().__init__(tree, greedy)

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        node = self.tree.root
        while not node.complete:
            exp = yield from self.expand(node)
            self.used(seen, node)
            if len(exp.ids) == 0:
                if node is self.tree.root:
                    raise self.empty_language()
                return node  # a dead end: incomplete, marked as such
            # P_con(s_i | s_<i) ∝ P(s_i | s_<i) over the valid tokens exp.ids
            i = argmax(exp.p) if self.greedy else draw(exp.p, rng)
            node = self.tree.child(node, int(exp.ids[i]))
        return node
