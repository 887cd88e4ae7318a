"""ASAp (Park et al. 2024), the paper's RQ4 baseline: sample from P_Q, never backtrack.

Each sample walks from the root drawing s_i ~ P_Q(· | s_<i) (formula 3) with the Q learned
by all earlier samples of the prompt; opening each new prefix refines Q (formula 2) for the
samples after it. A walk that reaches a dead end (only possible through max_new_tokens or
a constraint with dead ends) is discarded and redrawn with the refined Q (``restarts``).
"""

from __future__ import annotations

from .base import Method
from .draw import argmax, draw
from .tree import Node, QTable


class ASAp(Method):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.Q = QTable(self.tree)  # shared by every sample of the prompt

    def sample(self) -> Node:
        root = self.tree.root
        while True:
            node = root
            while not node.complete:
                self.Q.open(node)
                self.use(node)
                if self.Q.q(root) == 0:
                    raise self.empty_language()
                if self.Q.q(node) == 0:
                    break  # dead end: redraw
                w = self.Q.weights(node)
                i = argmax(w) if self.greedy else draw(w, self.rng)
                node = self.tree.child(node, int(node.expansion.ids[i]))
            else:
                return node
            self.restarts += 1
