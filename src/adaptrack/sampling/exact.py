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

What happens between rounds is free as long as it depends on earlier rounds only, never on
an attempt of the round it shapes: given everything before an attempt, it accepts s with
probability P(s)·c(s) / Q[ε] whatever that Q is, so its slot's first accepted attempt is
an exact draw (and the slots stay independent: each factor is the target's, whatever the
others drew). Three uses of that freedom cut the attempts wasted on a coarse Q, or the
rounds spent:

- *The root is opened* before the first round: its expansion is the call every first
  attempt waits for anyway, and an attempt that proposes from P at an unopened root
  rejects with the mass of every invalid first token. (Other expansions known before an
  attempt asks, a fed chain's rest, are left unopened: opening them would make a prefilled
  chain change the samples, which docs/design.md §2 promises it does not.)
- *A schedule* says how many attempts a round runs (:data:`SCHEDULES`), at most the walks
  in flight (``parallel``); the slots take them lowest index first, the others wait at the
  barrier for a later round. ``useful`` runs twice as many as the last round
  had useful attempts, and at least half the slots waiting; an attempt is useful when it
  was accepted or saw unopened a prefix that no attempt started before it in its round saw
  (a rejection that teaches Q nothing new is the waste of running in parallel). So while
  Q is coarse half the slots wait, and once attempts are accepted a round is as wide as
  before.
- *Several attempts for one slot*: when a round has more attempts than slots waiting (one
  sample, or a request's last ones) a slot runs its share at once, each on its own random
  stream, their model calls in one batch, and keeps the first accepted in attempt order
  (given Q the attempts are independent draws, so the first accepted is a draw of the
  target; the others count as rejections). A request run one walk at a time
  (``parallel=False``) keeps one attempt at a time.

Each number is a function of earlier rounds, so every schedule is exact; the chi-square
tests run each one (tests/sampling/test_distribution.py, tests/sampling/test_engine.py).

The ``ahead`` schedule (the default) has no rounds: a request runs one walk at a time (the
engine's ``serial``), and its attempts run one at a time, each on the Q every earlier one left (the
fewest rejections), each on its own random stream (seeded in attempt order from the first
sample's stream), one random key per step; a sample is the first attempt accepted after
the previous sample's. What it batches is model calls: while the running attempt waits for
an expansion, the next attempts (the request's *width* in all at most: the ``width``
option, else what the model's cost model gives, ``lm/cost.py``, within a ``parallel``
given as a number; as many as samples are missing, or 2^k after k rejections if more, so
that a request whose first attempts are accepted fetches nothing it does not use) are
followed ahead on the current Q, read-only, each to the first prefix whose expansion is
not known, and those prefixes share the running attempt's pass. Where nothing but the
search ends the request (no call budget, no early hand-over: the evaluation's searches) the
width counts the attempts still under way: one followed ahead that already ended waits
for its turn without a row while a later one takes its place in the pass (the window holds
at most :data:`WINDOW` times the count above, of which that count under way), so a long
running attempt does not leave the passes narrow. Under a budget those later
attempts mostly come after the search has handed over, and their rows are waste.
When an attempt ends Q changes only along its path, so a course followed ahead is taken
again only from the prefixes on that path, and goes on from where its step moved. Each
step is an exponential race keyed by the step's random number (:class:`Draws`), which
keeps its winner when Q falls elsewhere and when a prefix not yet opened is opened: an
attempt retraces the course whose calls were fetched for it, except where Q lowered that
course's own token. Given Q each step is a draw of formula 3 (or of P at a prefix not
opened), so each attempt is an attempt of the one-at-a-time kind; what was fetched ahead
only fills the cache, and a seed's samples are the same for every width, ``parallel``
and cache bound, so for every machine the cost model measures. (Following ahead makes
prefixes and model calls, so it can reach ``max_nodes`` or the call budget sooner: where
a budget hands samples to the CD fallback, the point it does so moves with the width.)

With ``temperature=0`` it returns the most probable valid complete sequence: best-first
search by -log P over the tree (``sampling/bestfirst.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import cast

import numpy as np

from ..cache import LRU
from .base import BARRIER, Method, Walk
from .bestfirst import BestFirst
from .draw import draw
from .expansion import Expansion
from .qtable import QTable
from .races import Course, Draws
from .tree import Node, PrefixTree


class Exact(Method):
    """Exact samples of P(s | c) by adaptive rejection (module docstring); with ``greedy``,
    the most probable valid complete sequence.

    >>> import adaptrack as at
    >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [3, 1, 1], eos=2)
    >>> tree = PrefixTree([], at.constraints.choice(["b", "ab"]).bind(lm.vocab))
    >>> from adaptrack.sampling.engine import expand_many
    >>> walk = Exact(tree, greedy=True).walk(set(), np.random.default_rng(0))
    >>> try:
    ...     while True:                # the driver's part: the model calls it waits for
    ...         asked = next(walk)     # a prefix or a tuple of them (never BARRIER here)
    ...         expand_many(lm, tree, list(asked) if isinstance(asked, tuple) else [asked])
    ... except StopIteration as done:
    ...     print(done.value.tokens)          # "b" then EOS: .2 · .2 > P(ab EOS) = .6 · .2 · .2
    (1, 2)
    """

    name = "exact"
    searches = True

    independent = False  # Q is shared
    parallel = True  # rounds keep every attempt on one Q: exact with any number in flight
    eager_chains = False  # a rejected attempt need not have fed the chain it left
    #: How many attempts a round runs (:data:`SCHEDULES`; module docstring).
    schedule = "ahead"
    #: Whether a slot may run several attempts in a round when there are more attempts
    #: than slots (n = 1, or a request's last samples), keeping the first accepted.
    several = True
    #: Whether the root is opened before the first attempt.
    open_root = True
    #: ``useful``: a round runs ``growth`` times the last round's useful attempts, and at
    #: least ``floor`` of the slots waiting (benchmarks/rounds.py measures other values).
    growth, floor = 2.0, 0.5
    options = ("width",)
    #: ``ahead``: the attempts a walk follows at most at once, the one running and the next
    #: ones whose model calls it fetches ahead, whatever the request's width (which bounds
    #: them: the ``width`` option, else the model's cost model; 2^k after k rejections);
    #: None: no bound but the width.
    lookahead: int | None = None

    def __init__(self, tree: PrefixTree, greedy: bool, *, width: int | None = None) -> None:
        """Exact sampling over ``tree``; ``greedy``: the most probable valid sequence;
        ``width``: the attempts followed at once under ``ahead`` (None: the model's cost
        model gives it when the request is submitted)."""
        super().__init__(tree, greedy)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of "
                             f"{', '.join(SCHEDULES)}")
        self.Q = QTable(self.tree)
        self._search = BestFirst(self)
        self._deferred: list[Node] = []  # the root, opened before the first round
        self._width = 1  # attempts this round may start
        self._tickets = self._width  # of which not yet started
        self._ended = self._accepted = 0  # attempts of this round
        # This round's attempts as (order started, accepted, prefixes seen unopened).
        self._outcomes: list[tuple[int, bool, list[Node]]] = []
        self._asking = 0  # walks of this round that will ask for attempts in the next
        self._started = 0  # attempts started so far (their order)
        self._share = 1  # attempts a slot may take in this round
        # ``ahead``: one walk at a time (its attempts one at a time), and what one uniform
        # becomes at the prefixes drawn from lately.
        self.serial = self.schedule == "ahead"
        self.spends_width, self.asked_width = self.serial and not greedy, width
        self._seeds: np.random.Generator | None = None  # the attempts' seeds, in order
        self._window: list[Course] = []  # the running attempt, then the next ones in order
        # Prefixes whose step Q changed since the next attempts' courses were followed:
        # they are followed only when the running attempt waits for the model (a search
        # whose prefixes are all known needs none of them).
        self._stale: set[int] = set()
        self._returned = 0  # samples accepted
        self._draws: LRU[int, Draws] = LRU(DRAWS_BYTES, size=lambda d: d.nbytes)

    def release(self) -> None:
        """The end of a round: open what its attempts saw (formula 2, §7.2.1 update), then
        size the next round from this one's outcome."""
        self._outcomes.sort(key=lambda o: o[0])  # the order started: the same whatever the cache
        for x in self._deferred + [x for *_, nodes in self._outcomes for x in nodes]:
            self.Q.open(x)  # parents first: Q stays consistent
        self._deferred.clear()
        if self._ended:
            if self.schedule == "useful":
                self._width = int(self.growth * self._count_useful())
        if self.schedule == "useful":  # never fewer than ``floor`` of the slots waiting
            self._width = max(self._width, int(self.floor * self._asking + 0.5), 1)
        self._width = min(self._width, self.width)  # ``parallel``: attempts in flight
        self._tickets = self._width
        # Several attempts for one slot only when every slot of the next round is waiting
        # now: after a round that accepted, new slots may start and take their own.
        waiting = self._asking if not self._accepted else 0
        several = self.several and self.width > 1  # one walk at a time: one attempt too
        self._share = -(-self._width // waiting) if several and waiting else 1
        self._ended = self._accepted = self._asking = 0
        self._outcomes.clear()

    def walk(self, seen: set[int], rng: np.random.Generator) -> Walk:
        if self.greedy:
            return (yield from self._search.walk(seen))
        if self.serial:
            return (yield from self._ahead(seen, rng))
        return (yield from self._sample(seen, rng))

    def _sample(self, seen: set[int], rng: np.random.Generator) -> Walk:
        root = self.tree.root
        if self.open_root and not self.Q.is_open(root):
            # The first round's attempts would all propose from P at the root: open it first
            # (its expansion is the call they would wait for anyway).
            yield from self.expand(root)
            self.tree.pin(root)
            self._deferred.append(root)
            self._asking += 1
            yield BARRIER
        while True:
            if self.Q.dead(root):
                raise self.empty_language()
            k = self._take()
            while not k:
                self._asking += 1
                yield BARRIER  # not this round's: wait for a later one, Q unchanged
                k = self._take()
            first = self._started
            self._started += k
            ended = yield from self._attempts(k, first, seen, rng)
            kept = next((node for node in ended if node.complete), None)
            self.restarts += k - (kept is not None)  # rejected, or accepted after the kept one
            if kept is None:
                self._asking += 1
            yield BARRIER  # every attempt in flight ends before Q changes (``release``)
            if kept is not None:
                return kept

    def _take(self) -> int:
        """How many attempts this slot makes in this round (0: none, it waits)."""
        if self.schedule == "fixed":
            return 1
        k = min(self._share, self._tickets)
        self._tickets -= k
        return k

    def _count_useful(self) -> int:
        """This round's useful attempts: accepted, or the first in the order started to see
        some prefix unopened (in that order, not the order they ended, which depends on
        which expansions the cache held)."""
        seen: set[int] = set()
        useful = 0
        for _, accepted, nodes in sorted(self._outcomes, key=lambda o: o[0]):
            fresh = {id(x) for x in nodes} - seen
            useful += accepted or bool(fresh)
            seen |= fresh
        return useful

    def _attempts(self, k: int, first: int, seen: set[int], rng: np.random.Generator
                  ) -> Generator[object, None, list[Node]]:
        """``k`` attempts on this round's Q, their model calls shared; the nodes where
        they ended, in attempt order (the slot keeps the first complete one: given Q the
        attempts are independent draws, so the first accepted is a draw of the target)."""
        # Each attempt its own stream, drawn in attempt order: how the attempts interleave
        # (which prefixes the cache or a prefilled chain already holds) changes no sample.
        rngs = [rng] if k == 1 else [np.random.default_rng(int(s))
                                     for s in rng.integers(0, 2**63, size=k)]
        runs = [self._attempt(first + j, seen, r) for j, r in enumerate(rngs)]
        ended: list[Node | None] = [None] * k
        waits: dict[int, object] = {}

        def step(i: int) -> None:
            try:
                waits[i] = next(runs[i])
            except StopIteration as stop:
                ended[i] = stop.value
                waits.pop(i, None)

        for i in range(k):
            step(i)
        while waits:
            asked = tuple(waits.values())
            yield asked[0] if len(asked) == 1 else asked
            for i in list(waits):
                step(i)
        return [node for node in ended if node is not None]

    def _attempt(self, order: int, seen: set[int], rng: np.random.Generator
                 ) -> Generator[Node, None, Node]:
        """One attempt from the root on this round's Q: the node where it ended (complete:
        accepted). The prefixes it saw unopened are opened at the round's end."""
        node, unopened = self.tree.root, []
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
            self.tree.pin(x)  # kept until the round's end opens it
        self._ended += 1
        self._accepted += node.complete
        self._outcomes.append((order, node.complete, unopened))
        return node

    def _ahead(self, seen: set[int], rng: np.random.Generator) -> Walk:
        """The ``ahead`` schedule: the request's attempts one at a time, each on the Q every
        earlier one left and on its own stream, while the next ones' model calls share the
        running attempt's passes; this sample is the first accepted (module docstring)."""
        root, Q = self.tree.root, self.Q
        if self.open_root and not Q.is_open(root):
            yield from self.expand(root)
            Q.open(root)
            self._draws.pop(id(root))
        if self._seeds is None:  # the first sample's stream seeds every attempt's, in order:
            self._seeds = rng  # no span, cache or sample boundary changes them
        seeds, window = self._seeds, self._window
        while True:
            if Q.dead(root):
                raise self.empty_language()
            if not window:
                window.append(Course(root, int(seeds.integers(0, 2**63))))
            attempt, stale = window[0], self._stale
            wait = self._follow(attempt, stale)
            if wait is not None:  # the next attempts' calls share its pass
                # As many attempts followed as samples are missing (each needs one at
                # least), and 2^k after k rejections: a request whose first attempts are
                # accepted fetches nothing it does not use.
                missing = self.samples - self._returned
                span = min(self.lookahead or self.width, self.width,
                           max(missing, 1 << min(self.restarts, 30)))
                asked = self._asks(wait, span, seeds)
                yield asked[0] if len(asked) == 1 else asked
                continue
            path = attempt.path
            end = path[-1]
            steps = path[:-1] if end.complete else path  # a rejected attempt stepped at its end
            for x in steps:
                self.used(seen, x)
            for x in [x for x in steps if not Q.is_open(x)]:
                yield from self.expand(x)  # (in case the cache dropped it meanwhile)
                self.tree.pin(x)
            opened = -1
            for d, x in enumerate(steps):
                if not Q.is_open(x):
                    Q.open(x)  # parents first
                    opened = d
            # Q moved only along this path, at the prefixes opened and their ancestors: the
            # other courses need new steps there alone.
            for x in path[:opened + 1]:
                stale.add(id(x))
                self._draws.pop(id(x))
            window.pop(0)  # the next attempt, already followed ahead, is the next sample's
            if end.complete:  # when this one is accepted
                self._returned += 1
                return end
            self.restarts += 1

    def _asks(self, wait: Node, span: int, seeds: np.random.Generator) -> tuple[Node, ...]:
        """What the running attempt's pass asks: its ``wait``, and where each attempt followed
        ahead waits, ``span`` of them still under way at most (an unbounded search's window
        starts later ones in place of those that ended, up to :data:`WINDOW` x ``span``)."""
        window, asks, running = self._window, {id(wait): wait}, 1
        limit = (WINDOW if self.unbounded else 1) * span
        i = 1
        while i < len(window) or (running < span and len(window) < limit):
            if i == len(window):
                window.append(Course(self.tree.root, int(seeds.integers(0, 2**63))))
            ahead = self._follow(window[i], self._stale)
            if ahead is not None:
                asks.setdefault(id(ahead), ahead)
                running += 1
            i += 1
        self._stale.clear()
        return tuple(asks.values())

    def _follow(self, course: Course, changed: set[int]) -> Node | None:
        """Bring ``course`` up to date with Q: where a prefix it stepped from is in
        ``changed`` (ids), the step is taken again, and where it goes elsewhere the course
        goes on from there. The unexpanded prefix it waits for; None once it ended."""
        path, d = course.path, 0
        # ``changed`` holds ended attempts' paths from the root (with their ancestors), so
        # the prefixes of a course in it come first: past the first one not in it, no step
        # moved. (A prefix in it whose step did not move is taken again to the same child.)
        while (d < len(path) - 1 and id(path[d]) in changed
               and self._step(path[d], course.key(d)) is path[d + 1]):
            d += 1
        if id(path[d]) in changed:
            del path[d + 1:]
            course.ended = False
        if course.ended:
            return None
        while not path[-1].complete:
            nxt = self._step(path[-1], course.key(len(path) - 1))
            if nxt is _WAIT:
                return path[-1]
            if nxt is None:
                break  # an invalid token: rejected
            path.append(cast(Node, nxt))
        course.ended = True
        return None

    def _step(self, node: Node, key: int) -> Node | object | None:
        """Where an attempt at ``node`` goes with the step's random ``key`` on the current
        Q: the child (from P_Q at an opened prefix, from P at another), None (an invalid
        token) or ``_WAIT`` (the prefix's expansion is not known yet)."""
        Q = self.Q
        table = self._draws.get(id(node))
        if Q.is_open(node):
            if table is None or not table.opened:
                exp = node.expansion  # pinned once opened
                assert exp is not None
                table = Draws(exp, Q.weights(node))
                self._draws.put(id(node), table)
            return self.tree.child(node, Q.token(node, table.pick(key)))
        exp = node.expansion
        if exp is None:
            return _WAIT
        if table is None or table.exp is not exp:
            table = Draws(exp)
            self._draws.put(id(node), table)
        i = table.pick(key)
        return None if i < 0 else self.tree.child(node, int(exp.ids[i]), exp)

    def _propose(self, exp: Expansion, rng: np.random.Generator) -> int:
        """u ~ P(· | x) over the whole vocabulary; -1 stands for any invalid token."""
        u = rng.random()
        cdf = np.cumsum(exp.p, dtype=np.float64)
        if len(cdf) == 0 or u >= cdf[-1]:
            return -1
        return int(exp.ids[min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)])


#: Round schedules: ``fixed``, every slot in flight makes an attempt each round (and, with
#: ``open_root`` off, the rounds as they were before the schedules: the baseline of
#: benchmarks/rounds.py); ``useful`` and ``ahead`` (the default), the module docstring's.
SCHEDULES = ("fixed", "useful", "ahead")

#: An unbounded search's ``ahead`` window holds at most this many times its span (4 took a
#: tenth fewer passes than 2 on two tuned MaskBench requests, for three times the extra rows).
WINDOW = 2

#: What :meth:`Exact._step` yields for a prefix whose expansion is not known yet.
_WAIT = object()
#: Bytes of the tables :class:`Draws` keeps for the prefixes drawn from lately.
DRAWS_BYTES = 64 << 20
