"""The Q table of the AdapTrack paper: Q[x] ≈ P(c | x) for the prefixes a run has opened
(formula 2), kept consistent as prefixes open (§7.2.1; docs/design.md §3).

Methods that share Q across samples keep one table; AdapTrack with fresh state makes one
per sample.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InternalError
from .expansion import Expansion
from .tree import Node, PrefixTree


class QTable:
    """Q[x] ≈ P(c | x) for the prefixes a run has opened (the AdapTrack paper, formula 2).

    A prefix is *new* until opened: then Q[x] = c(x), which is 1 for every node in the tree
    (invalid prefixes never become nodes). Opening x replaces 1 by the valid mass below it,
    Q[x] = Σ_u P(u|x) Q[x::u], and every ancestor s of x changes by P(x'|s) times the same
    amount (§7.2.1: Q[s] ← Q[s] − P(x'|s)(1 − q)). The weights w[u] = P(u|x) Q[x::u] over
    the valid tokens give P_Q(u|x) = w[u] / Q[x] (formula 3); a count of children with
    Q > 0 lets dead branches reach exactly 0.

    Q is kept as log Q (docs/design.md §3, numerics): the valid mass below a long prefix
    (200 tokens of odds 1:50 is 1e-340) is below float64's range, and a Q that underflowed
    to 0 would read as a dead branch. Deadness comes from the count alone (log Q = -inf),
    never from a value that rounded to 0.

    Per opened node the table keeps only log Q[x::u] of the children whose Q is not 1 (the
    others weigh P(u|x), read from the tree's expansion), so a table costs a few numbers per
    opened child, not a vocabulary-wide array per opened prefix; the weights of the few
    nodes drawn from last are kept as arrays (:data:`CACHED_WEIGHTS`), so that a search
    that opens a node's children one by one does not rebuild them from the dict each draw.

    With ``moves=True``, :meth:`open` leaves in :attr:`moved` what the update did along the
    opened prefix's path (what AdapTrack's lines 11-14 read), so that a walk need not compare
    P_Q at every depth; the other methods do not read it and do not pay for it.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [2, 1, 1], eos=2)
    >>> c = at.constraints.choice(["a", "b"]).bind(lm.vocab)
    >>> from adaptrack.sampling import TreeOptions
    >>> tree = PrefixTree([], c, TreeOptions(end="eos"))  # "leave": "a" ends with p = 1
    >>> Q = QTable(tree)
    >>> from adaptrack.sampling.engine import expand
    >>> _ = expand(lm, tree, tree.root)         # the driver's model call (the engine's)
    >>> Q.open(tree.root); Q.q(tree.root)       # a and b are valid first tokens
    0.75
    >>> a = tree.child(tree.root, 0); _ = expand(lm, tree, a)
    >>> Q.open(a)                          # after a only EOS: .5·.25 + .25
    >>> round(Q.q(tree.root), 12)
    0.375
    >>> Q.log_q(tree.root) == math.log(Q.q(tree.root)), Q.dead(tree.root)  # kept as log Q
    (True, False)
    """

    def __init__(self, tree: PrefixTree, *, moves: bool = False) -> None:
        self.tree, self.moves = tree, moves
        self._logq: dict[int, float] = {}  # log Q[x]; -inf once every child is dead
        self._alive: dict[int, int] = {}
        self._expansions: dict[int, Expansion] = {}
        self._below: dict[int, dict[int, float]] = {}  # slot → log Q[x::u], where not 0
        self._exact: dict[int, float] = {}  # log Q[x] when last summed in full
        self._cache: dict[int, _Drawn] = {}  # the last nodes drawn from, by age
        #: After :meth:`open`: per link x → n of the opened prefix's path that the update
        #: changed, deepest first, ``(n, p, log_ratio)``: p = P_Q(n|x) before the update as
        #: :meth:`prob` computed it, and log p'/p from the logs (within ~1e-12 of the
        #: log of what :meth:`prob` gives now, -inf when n died, nan when x died). Links
        #: not listed kept P_Q(n|x) bit for bit.
        self.moved: list[tuple[Node, float, float]] = []

    def is_open(self, node: Node) -> bool:
        return id(node) in self._logq

    def lowered(self, node: Node) -> int:
        """How many children of the open ``node`` have a Q other than 1: the children
        opened under it (but one whose valid mass sums to exactly 1), counted in O(1)."""
        return len(self._below[id(node)])

    def log_q(self, node: Node) -> float:
        """log Q[node]: 0 for a prefix this run has not opened, -inf for a dead one."""
        return self._logq.get(id(node), 0.0)

    def q(self, node: Node) -> float:
        """Q[node]; 1 for a prefix this run has not opened (complete ones included). May
        round to 0 for a live prefix of tiny mass: ask :meth:`dead` whether it is dead."""
        return math.exp(self._logq.get(id(node), 0.0))

    def dead(self, node: Node) -> bool:
        """Whether no valid complete sequence lies below ``node`` (every child found dead)."""
        return self._logq.get(id(node), 0.0) == -math.inf

    def weights(self, node: Node) -> np.ndarray:
        """Weights proportional to w[u] = P(u|node) Q[node::u] over ``expansion.ids`` (node
        must be open and not dead), read-only and valid until the next :meth:`open` (which
        may update them in place). They are w itself while Q[node] is within
        float64's comfortable range, else w / max w (so they never all round to 0)."""
        key = id(node)
        if self._logq[key] < SCALED_BELOW:
            self._cache.pop(key, None)
            return self._scaled(key)[0]
        drawn = self._cache.pop(key, None)
        if drawn is None:
            w = self._expansions[key].p.astype(np.float64)
            below = self._below[key]
            if below:
                slots = np.fromiter(below.keys(), dtype=np.int64, count=len(below))
                lq = np.fromiter(below.values(), dtype=np.float64, count=len(below))
                # A weight that rounds to 0 here is below e^-440 of the total: never drawn.
                w[slots] *= np.exp(lq)
            w.flags.writeable = False  # shared with the next draw: readers copy to change
            drawn = _Drawn(w)
            if len(self._cache) >= CACHED_WEIGHTS:
                del self._cache[next(iter(self._cache))]
        self._cache[key] = drawn
        return drawn.w

    def cumulative(self, node: Node) -> np.ndarray | None:
        """``np.cumsum(weights(node))``, bit for bit, where the table keeps ``node``'s
        weights (it was drawn from lately; else None), read-only and valid until the next
        :meth:`open`. A child that died since the last call only makes the sums after it
        be added again, in the same order, so a search that opens a node's children one by
        one does not sum its whole vocabulary each draw."""
        drawn = self._cache.get(id(node))
        if drawn is None:
            return None
        w, cdf, start = drawn.w, drawn.cdf, drawn.stale
        if cdf is None:
            cdf = drawn.cdf = np.cumsum(w, dtype=np.float64)
        elif start < len(w):
            # A cumulative sum adds left to right: going on from the last good sum gives
            # the numbers a sum from the start would.
            tail = w[start:].copy()
            if start:
                tail[0] += cdf[start - 1]
            cdf.flags.writeable = True
            np.cumsum(tail, dtype=np.float64, out=cdf[start:])
        cdf.flags.writeable = False
        drawn.stale = len(w)
        return cdf

    def _scaled(self, key: int) -> tuple[np.ndarray, float]:
        """``(v, m)`` with w = v · e^m and max v = 1 (m = -inf when every child is dead)."""
        lw = np.log(self._expansions[key].p.astype(np.float64))
        below = self._below[key]
        if below:
            slots = np.fromiter(below.keys(), dtype=np.int64, count=len(below))
            lw[slots] += np.fromiter(below.values(), dtype=np.float64, count=len(below))
        m = float(lw.max()) if len(lw) else -math.inf
        if m == -math.inf:
            return np.zeros(len(lw)), m
        return np.exp(lw - m), m

    def token(self, node: Node, i: int) -> int:
        """The token at position ``i`` of ``weights(node)``."""
        return int(self._expansions[id(node)].ids[i])

    def prob(self, child: Node) -> float:
        """P_Q(child.token | child.parent), formula 3."""
        key = id(child.parent)
        lq = self._logq[key]
        below = self._below[key].get(child.slot, 0.0)
        if lq == -math.inf or below == -math.inf:
            return 0.0
        return math.exp(child.token_logp + below - lq)

    def open(self, node: Node) -> None:
        """Mark ``node`` old: Q[node] becomes its valid mass and ancestors follow (formula 2)."""
        self.moved = []
        if self.is_open(node):
            return
        exp = node.expansion
        if exp is None:
            raise InternalError("Q opens a prefix whose expansion the walk did not wait for "
                                "(Method.expand)")
        self.tree.pin(node)
        key = id(node)
        self._expansions[key] = exp
        self._below[key] = {}
        self._alive[key] = len(exp.p)
        # Each p is a positive float (the tree drops zeros), so a non-empty sum is > 0.
        self._logq[key] = self._exact[key] = (
            math.log(float(exp.p.sum(dtype=np.float64))) if len(exp.p) else -math.inf)
        self._propagate(node)

    def _propagate(self, node: Node) -> None:
        # §7.2.1: walk up once; each parent's weight for the path token becomes
        # P(token|parent) · Q[child], and its Q moves by the same difference, computed
        # relative to Q[parent] so that no term leaves float64's range.
        # ``moved`` gets, per link, P_Q(n|x) before (as :meth:`prob` computed it) and the
        # log of its ratio, so that a reader compares P_Q only where it moved.
        moved, cache, logq = self.moved, self._cache, self._logq
        new = logq[id(node)]
        while node.parent is not None:
            parent = node.parent
            key, i = id(parent), node.slot
            below = self._below[key]
            old = below.get(i, 0.0)
            if new == old:
                return
            below[i] = new
            drawn = cache.get(key)
            if drawn is not None:
                if new == -math.inf:  # what weights() computes: p · e^-inf = 0
                    drawn.kill(i)
                else:
                    del cache[key]
            if new == -math.inf:
                self._alive[key] -= 1
            lq = logq[key]
            # An exact -inf once every child is dead, so emptiness is detected, never
            # approximated.
            if self._alive[key] == 0:
                new_lq = -math.inf
            else:
                lp = node.token_logp - lq
                r = (1.0 - math.exp(lp + old)) + math.exp(lp + new)
                new_lq = lq + math.log(r) if r > 0 else -math.inf
                # Each update errs by a rounding of the old Q, so the error relative to Q
                # grows as Q shrinks: sum again once Q is far below its last exact sum.
                if new_lq < self._exact[key] - RESUM_SHRINK:
                    new_lq = self._exact[key] = self._resum(key)
            logq[key] = new_lq
            if self.moves:
                moved.append((node, math.exp(node.token_logp + old - lq),
                              (new - old) - (new_lq - lq)))
            node, new = parent, new_lq

    def _resum(self, key: int) -> float:
        v, m = self._scaled(key)
        return m + math.log(float(v.sum())) if m > -math.inf else -math.inf


#: log Q below which :meth:`QTable.weights` scales the weights to max 1 (e^-300 ≈ 5e-131):
#: above it every weight that matters (> e^-400 of the total) is a normal float64.
SCALED_BELOW = -300.0
#: How many nodes' weights :meth:`QTable.weights` keeps as arrays (the last drawn from).
CACHED_WEIGHTS = 4
#: A Q that the running update has shrunk to below e^-RESUM_SHRINK (≈ 1e-4) of its last
#: full sum is summed again, which keeps its relative error about 1e-11 (measured: 6e-12
#: after 500 updates of one chain).
RESUM_SHRINK = math.log(1e4)


class _Drawn:
    """The weights of a node drawn from lately (:meth:`QTable.weights`), their cumulative
    sums once asked for, and the first position whose sum is stale."""

    __slots__ = ("cdf", "stale", "w")

    def __init__(self, w: np.ndarray) -> None:
        self.w, self.stale = w, len(w)
        self.cdf: np.ndarray | None = None

    def kill(self, i: int) -> None:
        """Child ``i`` died: its weight is 0 and the sums from it on are stale."""
        self.w.flags.writeable = True
        self.w[i] = 0.0
        self.w.flags.writeable = False
        self.stale = min(self.stale, i)
