"""``exact``: adaptive rejection sampling over the cached prefix tree (docs/design.md §3).

Each attempt draws a sequence from P_Q with Q fixed for the attempt: at an opened prefix
from P_Q(· | x) (formula 3), at a prefix not yet opened from the model's P(· | x) over the
whole vocabulary (unexplored children count as valid, Q = 1): with probability 1 − Σ_valid
P(u|x) an invalid token, which rejects the attempt, else a valid u ∝ P(u|x). Because Q
satisfies formula 2 at every opened prefix, the proposal gives every valid complete
sequence s the probability P(s) / Q[ε] (the telescoping product of the AdapTrack paper's
Theorem 5.1), so an
accepted attempt is an exact draw from P(s | c) ∝ P(s)·c(s). An attempt that picks an
invalid token is rejected; the prefixes it saw are opened (Q refined) and the next
attempt starts with fresh randomness.
Each rejection opens at least one prefix, so the number of attempts is bounded by the tree.
Q is shared by all samples of a prompt: later samples are rejected less.

Several samples run in parallel in rounds (the AdapTrack paper's §7.2.1 parallel update,
made exact): every attempt in flight reads the Q the previous round left, the prefixes the
attempts saw are opened only once all of them have ended, and each sample slot keeps its own
sequence of attempts until one is accepted. Given that Q, an accepted attempt is an exact
draw whatever the other slots do, so the n samples are independent draws of the target;
which Q each attempt sees depends on how many run at once (``generate``'s ``parallel``),
which can change the samples, never their distribution.

With ``temperature=0`` it returns the most probable valid complete sequence: best-first
search by -log P over the tree.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from .base import BARRIER, Method, Walk
from .draw import draw
from .qtable import QTable
from .tree import Expansion, Node, PrefixTree


class Exact(Method):
    """Exact samples of P(s | c) by adaptive rejection (module docstring); with ``greedy``,
    the most probable valid complete sequence.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree(lm, [], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> walk = Exact(tree, greedy=True).walk(set(), np.random.default_rng(0))
    >>> try:
    ...     while True:                # the driver's part: the model calls it waits for
    ...         asked = next(walk)     # a prefix or a tuple of them (never BARRIER here)
    ...         tree.expand_many(list(asked) if isinstance(asked, tuple) else [asked])
    ... except StopIteration as done:
    ...     print(done.value.tokens)          # "b" then EOS: .2 · .2 > P(ab EOS) = .6 · .2 · .2
    (1, 2)
    """

    independent = False  # Q is shared
    parallel = True  # rounds keep every attempt on one Q: exact with any number in flight
    eager_chains = False  # a rejected attempt need not have fed the chain it left

    def __init__(self, tree: PrefixTree, greedy: bool) -> None:
        """Exact sampling over ``tree``; ``greedy``: the most probable valid sequence."""
        super().__init__(tree, greedy)
        self.Q = QTable(self.tree)
        self._best: Node | None = None
        self._deferred: list[Node] = []  # prefixes this round's attempts saw unopened

    def release(self) -> None:
        """The end of a round: open what its attempts saw (formula 2, §7.2.1 update)."""
        for x in self._deferred:
            self.Q.open(x)
        self._deferred.clear()

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        if self.greedy:
            return (yield from self._most_probable(seen))
        root = self.tree.root
        while True:
            if self.Q.dead(root):
                raise self.empty_language()
            node, unopened = root, []
            while not node.complete:
                self.used(seen, node)
                if self.Q.is_open(node):
                    i = draw(self.Q.weights(node), rng)  # u ~ P_Q(· | x), formula 3
                    token = self.Q.token(node, i)
                else:
                    exp = yield from self.expand(node)
                    unopened.append(node)
                    token = self._propose(exp, rng)  # u ~ P(· | x): Q = 1 below x
                    if token < 0:
                        break  # an invalid token: rejected
                node = self.tree.child(node, token)
            for x in unopened:
                yield from self.expand(x)  # (in case the cache dropped it meanwhile)
            self._deferred.extend(unopened)  # parents first: Q stays consistent
            yield BARRIER  # every attempt in flight ends before Q changes (``release``)
            if node.complete:
                return node
            self.restarts += 1

    def _propose(self, exp: Expansion, rng: np.random.Generator) -> int:
        """u ~ P(· | x) over the whole vocabulary; -1 stands for any invalid token."""
        u = rng.random()
        cdf = np.cumsum(exp.p, dtype=np.float64)
        if len(cdf) == 0 or u >= cdf[-1]:
            return -1
        return int(exp.ids[min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)])

    def _most_probable(self, seen: set[int]) -> Walk:
        if self._best is not None:  # the same answer for every sample; count its prefixes
            node = self._best.parent
            while node is not None:
                self.used(seen, node)
                node = node.parent
            return self._best
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
                    self._best = node
                    return node
                if node.expansion is None:
                    yield (node, *self._next_cheapest(heap, order, expansions))
                exp = yield from self.expand(node)
                expansions[id(node)] = exp
                self.used(seen, node)
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
        raise self.empty_language()

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
        return self.tree.child(node, int(expansions[id(node)].ids[order[id(node)][k]]))


#: Prefixes the greedy search expands along with the one it needs (a sequential search's
#: model calls would otherwise serve one row each).
LOOKAHEAD = 7
