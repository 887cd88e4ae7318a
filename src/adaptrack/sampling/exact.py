"""``exact``: adaptive rejection sampling over the cached prefix tree.

Each attempt draws a sequence from P_Q with Q fixed for the attempt: at an opened prefix
from P_Q(· | x) (formula 3), at a prefix not yet opened from the model's P(· | x) over the
whole vocabulary (unexplored children count as valid, Q = 1). Because Q satisfies formula 2
at every opened prefix, the proposal gives every valid complete sequence s the probability
P(s) / Q[ε] (the telescoping product of Theorem 5.1), so an accepted attempt is an exact
draw from P(s | c) ∝ P(s)·c(s). An attempt that picks an invalid token is rejected; the
prefixes it saw are opened (Q refined) and the next attempt starts with fresh randomness.
Each rejection opens at least one prefix, so the number of attempts is bounded by the tree.
Q is shared by all samples of a prompt: later samples are rejected less.

With ``temperature=0`` it returns the most probable valid complete sequence: best-first
search by -log P over the tree.
"""

from __future__ import annotations

import heapq
import math

from .base import Method
from .draw import draw
from .tree import Node, QTable


class Exact(Method):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.Q = QTable(self.tree)
        self._best: Node | None = None

    def sample(self) -> Node:
        if self.greedy:
            return self._most_probable()
        root = self.tree.root
        while True:
            if self.Q.q(root) == 0:
                raise self.empty_language()
            node, seen = root, []
            while not node.complete:
                self.use(node)
                if self.Q.is_open(node):
                    i = draw(self.Q.weights(node), self.rng)
                    token = int(node.expansion.ids[i])
                else:
                    exp = self.tree.expand(node)
                    seen.append(node)
                    token = int(draw(exp.probs, self.rng))
                    if not exp.is_valid(token):
                        break  # rejected
                node = self.tree.child(node, token)
            for x in seen:  # parents first: Q stays consistent after the attempt
                self.Q.open(x)
            if node.complete:
                return node
            self.restarts += 1

    def _most_probable(self) -> Node:
        if self._best is not None:  # the same answer for every sample; count its prefixes
            node = self._best.parent
            while node is not None:
                self.use(node)
                node = node.parent
            return self._best
        tree = self.tree
        # Entries (cost, tiebreak, node, k): k = -1 is the node itself, k >= 0 its k-th most
        # probable child, pushed lazily so a wide vocabulary costs one entry per pop.
        heap: list[tuple[float, int, Node, int]] = [(0.0, 0, tree.root, -1)]
        order: dict[int, list[int]] = {}
        counter = 1
        while heap:
            cost, _, node, k = heapq.heappop(heap)
            if k < 0:
                if node.complete:
                    self._best = node
                    return node
                exp = tree.expand(node)
                self.use(node)
                if len(exp.ids):
                    order[id(node)] = sorted(range(len(exp.ids)), key=lambda j: -exp.p[j])
                    heapq.heappush(heap, (cost - math.log(exp.p[order[id(node)][0]]), counter,
                                          node, 0))
                    counter += 1
                continue
            ranks = order[id(node)]
            child = tree.child(node, int(node.expansion.ids[ranks[k]]))
            heapq.heappush(heap, (-child.logprob, counter, child, -1))
            counter += 1
            if k + 1 < len(ranks):
                nxt = node.expansion.p[ranks[k + 1]]
                heapq.heappush(heap, (-node.logprob - math.log(nxt), counter, node, k + 1))
                counter += 1
        raise self.empty_language()
