"""ASAp (Park et al. 2024), the paper's RQ4 baseline: sample from P_Q, never backtrack.

Each sample walks from the root drawing s_i ~ P_Q(· | s_<i) (formula 3) with the Q learned
by all earlier samples of the prompt; opening each new prefix refines Q (formula 2) for the
samples after it. A walk that reaches a dead end (only possible through max_new_tokens or
a constraint with dead ends) is discarded and redrawn with the refined Q (``restarts``).
"""

from __future__ import annotations

import numpy as np

from .base import Method, Walk
from .draw import argmax, draw
from .tree import QTable


class ASAp(Method):
    independent = False  # Q is shared

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.Q = QTable(self.tree)  # shared by every sample of the prompt

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        root = self.tree.root
        while True:
            node = root
            while not node.complete:
                if not self.Q.is_open(node):
                    yield from self.expand(node)
                    self.Q.open(node)
                self.used(seen, node)
                if self.Q.q(root) == 0:
                    raise self.empty_language()
                if self.Q.q(node) == 0:
                    break  # dead end: redraw
                w = self.Q.weights(node)
                i = argmax(w) if self.greedy else draw(w, rng)
                node = self.tree.child(node, self.Q.token(node, i))
            else:
                return node
            self.restarts += 1
