"""ASAp (Park et al. 2024), the AdapTrack paper's RQ4 baseline: sample from P_Q, never
backtrack (docs/design.md §3).

Each sample walks from the root drawing s_i ~ P_Q(· | s_<i) (the AdapTrack paper, formula 3)
with the Q learned by all earlier samples of the prompt; opening each new prefix refines Q
(formula 2) for the samples after it. A walk that reaches a dead end (only possible through
max_new_tokens or a constraint with dead ends) is discarded and redrawn with the refined Q
(``restarts``).
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw
from .qtable import QTable
from .tree import PrefixTree


class ASAp(Method):
    """ASAp: every sample draws from P_Q with the Q all earlier samples refined.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> ASAp(tree, greedy=True).Q.q(tree.root)    # nothing opened yet: Q = 1
    1.0
    """

    name = "asap"
    searches = True

    independent = False  # Q is shared

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """ASAp over ``tree``; ``greedy``: take the argmax of P_Q (temperature 0)."""
        super().__init__(tree, greedy)
        self.Q = QTable(self.tree)  # shared by every sample of the prompt

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        root = self.tree.root
        while True:
            node = root
            while not node.complete:
                if not self.Q.is_open(node):
                    yield from self.expand(node)
                    self.Q.open(node)  # formula 2: the new prefix refines Q
                self.used(seen, node)
                if self.Q.dead(root):
                    raise self.empty_language()
                if self.Q.dead(node):
                    break  # dead end: redraw
                w = self.Q.weights(node)  # P_Q(· | node) ∝ w, formula 3
                i = argmax(w) if self.greedy else draw(w, rng)
                node = self.tree.child(node, self.Q.token(node, i))
            else:
                return node
            self.restarts += 1
