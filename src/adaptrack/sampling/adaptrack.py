"""AdapTrack, Algorithm 2 of the AdapTrack paper, as stated (docs/design.md §3).

N[x] holds the next token sampled after prefix x. Each round collects the sequence N
spells (Algorithm 1); if it is complete it is returned (lines 6-7), otherwise the new
prefix s is opened, N[s] ~ P_Q(· | s) (line 9), Q is updated (line 10), and every earlier
prefix x keeps N[x] with probability P_Q'(n|x) / P_Q(n|x) or backtracks to a token drawn
from P_Q(· | x) without n (lines 11-19, formula 4). The update of line 10 says along which
links of the path it moved P_Q (``QTable.moved``); everywhere else p'/p is 1 and N[x] is
kept without a draw, so a round does Python work per depth only where a ratio fell. The
path itself is kept from round to round below the shallowest prefix that backtracked.

With fresh Q per sample (the default) the result is close to, not exactly, the target
distribution (docs/design.md §3); ``share_q`` keeps Q across the samples of a prompt.
``max_backtrack`` and ``min_backtrack_prob`` are the paper's §7.2.2 limits (not exact); a
prefix whose continuation is dead is always left, whatever the limits.
With ``temperature=0``, N[x] is the argmax of P_Q(· | x), re-chosen after each update.

Where the walk crawls a parent x, opening its children one by one and backtracking to x
after each (a text that must close within the last tokens of ``max_new_tokens``), the call
that opens the next child also fetches the expansions of the children the next draws at x
will take if each opened child is rejected in turn (``crawl_ahead``): one pass serves them
for little more than one row's cost. Those draws (formula 4 at a crawled parent) are
exponential races on random keys of their own, one vector per draw at x (:class:`Race`),
so the walk can read them before it makes them; a race draws from the same P_Q as an
inverse CDF, and unlike one its winner does not move when Q falls on other tokens. The
siblings fetched only fill the cache: Q, N, the draws and the prefixes a sample uses are
those of a walk without them, so a seed's samples are the same (docs/design.md §3). They
are nodes of the tree, at most ``AHEAD_SHARE`` of ``max_nodes`` in all: a request reaches
``max_nodes`` at most that much sooner.
"""

from __future__ import annotations

import math

import numpy as np

from .base import Method, Walk
from .draw import Race, argmax, draw
from .qtable import QTable
from .tree import Node, PrefixTree

# P_Q ratios within this of 1 count as unchanged: Q[s] of a prefix whose every child is valid
# sums to 1 only up to rounding, and whether a Bernoulli draw happens must not depend on it
# (else samples would change with the batch composition of the model's float arithmetic).
ROUNDING = 1e-9
# A link whose log p'/p from Q's logs (within ~1e-12 of the log of P_Q's ratio itself) is at
# least this keeps N[x] whatever the rounding: P_Q is computed again only where it is not.
SURELY_KEPT = math.log1p(-ROUNDING / 2)
# A parent is being crawled once this many of its children are open in Q: one opened
# child and a backtrack to its parent is the ordinary search, two is the walk coming back.
CRAWLED = 2
# The share of ``max_nodes`` that siblings fetched ahead may add to the tree in all.
AHEAD_SHARE = 0.25


class AdapTrack(Method):
    """AdapTrack's Algorithm 2: sample along N, open the new prefix, and let every earlier
    prefix keep its token or backtrack by formula 4.

    A forced chain is fed only where a walk steps into it (``eager_chains``): a walk often
    opens a chain's head and then backtracks away from it.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> AdapTrack(tree, greedy=False, share_q=True).independent  # shared Q: not lockstep
    False
    """

    name = "adaptrack"
    searches = True
    options = ("share_q", "max_backtrack", "min_backtrack_prob")

    #: Rows at most in the model call that opens a prefix whose parent is being crawled:
    #: the prefix and siblings fetched ahead (:meth:`_siblings_ahead`); 1 fetches none.
    #: On a CPU a row adds ~8 ms to a ~60 ms pass of the default model and nearly every
    #: sibling read from the races is used: 8, 16 and 32 cost about the same CPU, 16 the
    #: fewest passes for the rows (docs/benchmarks/crawl.md, the races).
    crawl_ahead = 16

    def __init__(
        self,
        tree: PrefixTree,
        greedy: bool,
        *,
        share_q: bool = False,
        max_backtrack: int | None = None,
        min_backtrack_prob: float = 0.0,
    ) -> None:
        """AdapTrack over ``tree``. ``greedy``: N[x] is the argmax of P_Q(· | x);
        ``share_q``: one Q for every sample of the prompt (else line 2 starts each sample
        with Q ← ∅); ``max_backtrack`` (prefix distance) and ``min_backtrack_prob`` (the
        smallest 1 − p'/p that may backtrack): the paper's §7.2.2 limits."""
        super().__init__(tree, greedy)
        self.eager_chains = False
        self.share_q, self.independent = share_q, not share_q
        self.parallel = False  # shared Q: one walk at a time unless asked (docs/design.md §3)
        self.max_backtrack, self.min_backtrack_prob = max_backtrack, min_backtrack_prob
        self.shared = QTable(self.tree, moves=True)
        self.races: dict[Node, Race] = {}  # the crawled parents' draws, with the shared Q

    def _choose(self, Q: QTable, rng: np.random.Generator, x: Node,
                exclude: Node | None = None, races: dict[Node, Race] | None = None) -> int:
        """A token from P_Q(· | x), or from formula 4 when ``exclude`` is the old N[x]'s node
        (by x's :class:`Race` where x is crawled: ``races``)."""
        w = Q.weights(x)
        j = None if exclude is None else exclude.slot
        if self.greedy:
            return Q.token(x, argmax(w, j))
        if races is not None and j is not None and Q.lowered(x) >= CRAWLED:
            race = races.get(x)
            if race is None:  # its keys: a seed from the walk's stream, drawn once
                race = races[x] = Race(int(rng.integers(1 << 63)))
            return Q.token(x, race.draw(w, j))
        # Q's kept sums count j: of use only where j's weight is already 0 (it died).
        cdf = Q.cumulative(x) if j is None or w[j] == 0 else None
        return Q.token(x, draw(w, rng, j, cdf))

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        Q = self.shared if self.share_q else QTable(self.tree, moves=True)  # line 2: Q ← ∅
        races = self.races if self.share_q else {}
        root = self.tree.root
        N: dict[Node, int] = {}  # line 3: N ← ∅
        # Other walks open prefixes of a shared Q while this one waits (parallel): P_Q may
        # then move at any depth of the path, not only where this walk's update moved it.
        concurrent = self.share_q and self.width > 1
        path = [root]
        while True:
            # Line 5, Algorithm 1: follow N from the empty prefix. N above the shallowest
            # prefix that backtracked is unchanged, so the path there is the last round's.
            while path[-1] in N:
                path.append(self.tree.child(path[-1], N[path[-1]]))
            s = path[-1]
            if s.complete:
                return s  # lines 6-7
            before = [Q.prob(child) for child in path[1:]] if concurrent else []  # line 13
            yield from self.expand_along(s, self._siblings_ahead(Q, s, races))
            Q.open(s)  # line 10 (opening s is what changes Q)
            self.used(seen, s)
            if Q.dead(root):
                raise self.empty_language()
            if not Q.dead(s):
                N[s] = self._choose(Q, rng, s)  # line 9
            # Line 11, longest prefix first, over the prefixes x whose P_Q(n|x) may have
            # moved (n = N[x], line 12): P_Q before the update (line 13) and log p'/p
            # (-inf: not known).
            moved = (Q.moved if not concurrent else
                     [(n, p, -math.inf) for n, p in zip(path[:0:-1], before[::-1], strict=True)])
            top = len(path)  # the shallowest depth whose N[x] changed
            for n, p, log_ratio in moved:
                if log_ratio >= SURELY_KEPT:
                    continue  # the test below keeps it: no need to compute P_Q again
                x = n.parent
                assert x is not None
                if Q.dead(x):
                    continue  # x is dead itself; its parent leaves it
                p_new = Q.prob(n)  # line 14
                if p_new >= p * (1 - ROUNDING) and p_new > 0:
                    continue  # kept for sure (p'/p ≥ 1); rounding must not consume randomness
                if self.greedy:
                    if self._may_backtrack(x, s, p, p_new):
                        best = self._choose(Q, rng, x)
                        self.backtracks += best != n.token
                        N[x], top = best, x.depth
                    continue
                if not self._may_backtrack(x, s, p, p_new):
                    continue
                # p = 0: another walk of a shared Q killed n while this one waited
                # (parallel); keeping the dead link would follow it forever.
                if p == 0 or rng.random() >= p_new / p:  # line 15: b ~ Bernoulli(p'/p), b = 0
                    N[x], top = self._choose(Q, rng, x, n, races), x.depth  # line 17, formula 4
                    self.backtracks += 1
            del path[top + 1:]

    def _may_backtrack(self, x: Node, s: Node, p: float, p_new: float) -> bool:
        if p_new == 0:
            return True  # N[x] leads only to invalid sequences: leaving is not optional
        if self.max_backtrack is not None and s.depth - x.depth > self.max_backtrack:
            return False
        return 1 - p_new / p >= self.min_backtrack_prob

    def _siblings_ahead(self, Q: QTable, s: Node, races: dict[Node, Race]) -> list[Node]:
        """The siblings of ``s`` whose expansions the call that opens ``s`` fetches too
        (``crawl_ahead``), only filling the cache: none unless s needs a model call and
        its parent x is being crawled (k ≥ CRAWLED children open in Q, its draws made by
        its race); then those x's next draws take if s and each of them in turn is
        rejected (Q falls to ~0 on them), whose expansions are not known, so that the pass
        has 2^k rows (s's included), at most ``crawl_ahead``."""
        x = s.parent
        if self.crawl_ahead <= 1 or x is None or s.expansion is not None:
            return []
        race = races.get(x)  # made once k reached CRAWLED at x, and k never falls
        if race is None:
            return []
        opened, tree = Q.lowered(x), self.tree
        room = min(self.crawl_ahead, 1 << min(opened, 30)) - 1
        room = min(room, int(AHEAD_SHARE * tree.max_nodes) - self.fetched,
                   tree.max_nodes - tree.num_nodes - 1)
        exp = x.expansion  # pinned: x is open
        if room <= 0 or exp is None:
            return []
        # A chain's next token would feed the whole chain: left to the walk (eager_chains).
        chained = x.pending[0] if x.pending else -1
        w = Q.weights(x).copy()
        w[s.slot] = 0.0
        ahead: list[Node] = []
        # Known winners cost no call but take a draw: read a few more draws than rows.
        for v in range(race.drawn, race.drawn + 2 * room):
            if not w.any():
                break
            i = race.winner(w, v)
            w[i] = 0.0
            token = int(exp.ids[i])
            if token == chained:
                continue
            child = tree.child(x, token, exp)
            if child.expansion is None:
                ahead.append(child)
                if len(ahead) == room:
                    break
        self.fetched += len(ahead)
        return ahead
