"""Best-first search by −log P over the prefix tree: the most probable valid complete
sequence (``exact`` at temperature 0, docs/design.md §3). Costs only grow along a path
(each token's −log P ≥ 0), so the first complete prefix popped is the answer."""

from __future__ import annotations

import heapq
import math

from .base import Method, Walk
from .expansion import Expansion
from .tree import Node


class BestFirst:
    """The search for one method's tree; ``method`` gives the walk's mechanics (its
    ``expand``, ``used`` and ``empty_language``).

    >>> import numpy as np, adaptrack as at
    >>> from adaptrack.sampling import PrefixTree
    >>> from adaptrack.sampling.exact import Exact
    >>> from adaptrack.sampling.engine import expand_many
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> search = BestFirst(Exact(tree, greedy=True))
    >>> walk = search.walk(set())
    >>> try:
    ...     while True:
    ...         asked = next(walk)
    ...         expand_many(lm, tree, list(asked) if isinstance(asked, tuple) else [asked])
    ... except StopIteration as done:
    ...     print(done.value.tokens, search.best is done.value)
    (1, 2) True
    """

    def __init__(self, method: Method) -> None:
        self.method, self.tree = method, method.tree
        self.best: Node | None = None

    def walk(self, seen: set[int]) -> Walk:
        """The most probable valid complete sequence, the same node for every call
        (each call counts its prefixes in ``seen``)."""
        if self.best is not None:  # the same answer for every sample; count its prefixes
            node = self.best.parent
            while node is not None:
                self.method.used(seen, node)
                node = node.parent
            return self.best
        tree = self.tree
        # Entries (cost, tiebreak, node, k): k = -1 is the node itself, k >= 0 its k-th most
        # probable child, pushed lazily so a wide vocabulary costs one entry per pop.
        heap: list[tuple[float, int, Node, int]] = [(0.0, 0, tree.root, -1)]
        order: dict[int, list[int]] = {}
        expansions: dict[int, Expansion] = {}
        counter = 1
        while heap:
            cost, _, node, k = heapq.heappop(heap)
            if k < 0:
                if node.complete:
                    self.best = node
                    return node
                if node.expansion is None:
                    yield (node, *self._next_cheapest(heap, order, expansions))
                exp = yield from self.method.expand(node)
                expansions[id(node)] = exp
                self.method.used(seen, node)
                if len(exp.ids):
                    order[id(node)] = sorted(range(len(exp.ids)), key=lambda j: -exp.p[j])
                    heapq.heappush(heap, (cost - math.log(exp.p[order[id(node)][0]]), counter,
                                          node, 0))
                    counter += 1
                continue
            ranks, exp = order[id(node)], expansions[id(node)]
            child = self._child(node, k, order, expansions)
            heapq.heappush(heap, (-child.logprob, counter, child, -1))
            counter += 1
            if k + 1 < len(ranks):
                nxt = exp.p[ranks[k + 1]]
                heapq.heappush(heap, (-node.logprob - math.log(nxt), counter, node, k + 1))
                counter += 1
        raise self.method.empty_language()

    def _next_cheapest(self, heap: list[tuple[float, int, Node, int]],
                       order: dict[int, list[int]], expansions: dict[int, Expansion]
                       ) -> list[Node]:
        """The prefixes the search would expand next (the cheapest entries of ``heap``,
        children made where an entry stands for one), to share a model call: best-first
        search expands every prefix cheaper than its answer, so only the last call's
        extras can go unused, and the answer is the same."""
        ahead = []
        # Prefixes made ahead count toward max_nodes: none near the limit, so the lookahead
        # never ends a search that would have found its answer.
        room = self.tree.max_nodes - self.tree.num_nodes > 2 * LOOKAHEAD
        for _, _, node, k in heapq.nsmallest(LOOKAHEAD, heap):
            if k >= 0:
                if not room:
                    continue
                node = self._child(node, k, order, expansions)
            if not node.complete and node.expansion is None:
                ahead.append(node)
        return ahead

    def _child(self, node: Node, k: int, order: dict[int, list[int]],
               expansions: dict[int, Expansion]) -> Node:
        """``node``'s k-th most probable valid child."""
        exp = expansions[id(node)]  # held here: the tree's cache may have dropped it
        return self.tree.child(node, int(exp.ids[order[id(node)][k]]), exp)


#: Prefixes the greedy search expands along with the one it needs (a sequential search's
#: model calls would otherwise serve one row each).
LOOKAHEAD = 7
