"""The Q table of the AdapTrack paper: Q[x] ≈ P(c | x) for the prefixes a run has opened
(formula 2), kept consistent as prefixes open (§7.2.1; docs/design.md §3).

Methods that share Q across samples keep one table; AdapTrack with fresh state makes one
per sample.
"""

from __future__ import annotations

import numpy as np

from .tree import Expansion, Node, PrefixTree


class QTable:
    """Q[x] ≈ P(c | x) for the prefixes a run has opened (the AdapTrack paper, formula 2).

    A prefix is *new* until opened: then Q[x] = c(x), which is 1 for every node in the tree
    (invalid prefixes never become nodes). Opening x replaces 1 by the valid mass below it,
    Q[x] = Σ_u P(u|x) Q[x::u], and every ancestor s of x changes by P(x'|s) times the same
    amount (§7.2.1: Q[s] ← Q[s] − P(x'|s)(1 − q)). The weights w[u] = P(u|x) Q[x::u] over
    the valid tokens give P_Q(u|x) = w[u] / Q[x] (formula 3); a count of children with
    Q > 0 lets dead branches reach exactly 0.

    Per opened node the table keeps only Q[x::u] of the children whose Q is not 1 (the
    others weigh P(u|x), read from the tree's expansion), so a table costs a few numbers per
    opened child, not a vocabulary-wide array per opened prefix.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> c = at.constraints.choice(["a", "b"]).bind(lm.vocab)
    >>> tree = PrefixTree(lm, [], c, end="eos")  # "leave" would end "a" with probability 1
    >>> Q = QTable(tree)
    >>> Q.open(tree.root); Q.q(tree.root)       # a and b are valid first tokens
    0.75
    >>> Q.open(tree.child(tree.root, 0)); float(Q.q(tree.root))  # after a only EOS: .5·.25 + .25
    0.375
    """

    def __init__(self, tree: PrefixTree) -> None:
        self.tree = tree
        self._q: dict[int, float] = {}
        self._alive: dict[int, int] = {}
        self._expansions: dict[int, Expansion] = {}
        self._below: dict[int, dict[int, float]] = {}  # slot → Q[x::u], where not 1

    def is_open(self, node: Node) -> bool:
        return id(node) in self._q

    def q(self, node: Node) -> float:
        """Q[node]; 1 for a prefix this run has not opened (complete ones included)."""
        return self._q.get(id(node), 1.0)

    def _weight(self, key: int, i: int) -> float:
        p = self._expansions[key].p[i]
        q = self._below[key].get(i)
        if q is None:
            return p
        return p * q if q > 0 else 0.0

    def weights(self, node: Node) -> np.ndarray:
        """w[u] = P(u|node) Q[node::u] over ``expansion.ids`` (node must be open); a new
        array."""
        key = id(node)
        w = self._expansions[key].p.copy()
        below = self._below[key]
        if below:
            slots = np.fromiter(below.keys(), dtype=np.int64, count=len(below))
            q = np.fromiter(below.values(), dtype=np.float64, count=len(below))
            w[slots] = np.where(q > 0, w[slots] * q, 0.0)
        return w

    def token(self, node: Node, i: int) -> int:
        """The token at position ``i`` of ``weights(node)``."""
        return int(self._expansions[id(node)].ids[i])

    def prob(self, child: Node) -> float:
        """P_Q(child.token | child.parent), formula 3."""
        key = id(child.parent)
        q = self._q[key]
        return self._weight(key, child.slot) / q if q > 0 else 0.0

    def open(self, node: Node) -> None:
        """Mark ``node`` old: Q[node] becomes its valid mass and ancestors follow (formula 2)."""
        if self.is_open(node):
            return
        exp = self.tree.expand(node)
        self.tree.pin(node)
        key = id(node)
        self._expansions[key] = exp
        self._below[key] = {}
        self._alive[key] = len(exp.p)
        self._q[key] = float(exp.p.sum()) if len(exp.p) else 0.0
        self._propagate(node, 1.0)

    def _propagate(self, node: Node, old_q: float) -> None:
        # §7.2.1: walk up once; each parent's weight for the path token becomes
        # P(token|parent) · Q[child], and its Q moves by the same difference.
        new_q = self._q[id(node)]
        while node.parent is not None and new_q != old_q:
            parent = node.parent
            key = id(parent)
            i = node.slot
            before = self._weight(key, i)
            self._below[key][i] = new_q
            after = self._weight(key, i)
            old_q = self._q[key]
            if new_q == 0 and before > 0:
                self._alive[key] -= 1
            # An exact 0 once every child is dead, so emptiness is detected, never approximated.
            if self._alive[key] == 0:
                self._q[key] = 0.0
            else:
                q = old_q + (after - before)
                # The running sum can drift below the true tiny mass; re-add when that matters.
                self._q[key] = q if q > 1e-9 else float(self.weights(parent).sum())
            node, new_q = parent, self._q[key]
