"""Greedy constrained decoding (paper §3.2): mask invalid tokens, renormalize, never look back.

P_con(s_i | s_<i) ∝ P(s_i | s_<i) · 1[s_i ∈ C(s_<i)]. It never fails on a constraint with no
dead ends; when it walks into one (a prefix that cannot finish within max_new_tokens) it
returns that prefix as an incomplete sample, as design.md §2 specifies.
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw


class ConstrainedDecoding(Method):
    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        node = self.tree.root
        while not node.complete:
            exp = yield from self.expand(node)
            self.used(seen, node)
            if len(exp.ids) == 0:
                if node is self.tree.root:
                    raise self.empty_language()
                return node  # a dead end: incomplete, marked as such
            i = argmax(exp.p) if self.greedy else draw(exp.p, rng)
            node = self.tree.child(node, int(exp.ids[i]))
        return node
