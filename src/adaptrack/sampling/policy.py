"""The budget policy of one request (docs/design.md §6): how many model calls its search may
make, what a sample's share is, when the first sample is due, and when and how the CD
fallback takes over. The engine consults it; nothing else decides these.

Each rule is one method here: :meth:`BudgetPolicy.bind` (a tree's call budget),
:meth:`~BudgetPolicy.start` (a sample's share, or the first sample's due),
:meth:`~BudgetPolicy.sample_done` (the whole budget once the first sample came),
:meth:`~BudgetPolicy.check` (before each model call; :meth:`~BudgetPolicy.check_search`
while the search runs), :meth:`~BudgetPolicy.past_share`
(one sample's walk hands over) and :meth:`~BudgetPolicy.take_over` (the whole request hands
over, with the tree's budgets lifted for CD). A new rule (an earlier hand-over) is written
here, once.

>>> BudgetPolicy.request_calls(192.0, 2), BudgetPolicy().max_calls is None
(384, True)
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from ..errors import CallLimitError, CheckTimeoutError, SearchLimitError
from .base import Method, Walk
from .budgets import CALLS_RULE, FIRST_SAMPLE_RULE
from .cd import WALK_STEPS, ConstrainedDecoding
from .tree import Node, PrefixTree

#: A short request's budget counts this many tokens a sample (the default max_new_tokens):
#: calls that few are cheap, and an exact sample of a regex or a small JSON object needs tens
#: to a few hundred.
SEARCH_TOKENS = 64

#: The early hand-over (docs/design.md §6): a search that has spent this many times what CD
#: would spend on its samples hands them to CD, so a request whose search cannot finish costs
#: about (EARLY_RATIO + 1) x CD in all instead of its whole budget and CD on top.
EARLY_RATIO = 2.0
#: The early hand-over never comes before a sample's search used this many prefixes: below
#: it, exact at n = 1 handed a quarter of the toy no_ab problem's samples to CD.
EARLY_FLOOR = 48


class EarlyHandover(CallLimitError):
    """The early hand-over's reason (:meth:`BudgetPolicy.check_search`,
    :meth:`BudgetPolicy.past_share`): a call budget the search set itself."""


class BudgetPolicy:
    """The budgets of a request of ``n`` samples: ``sample_calls`` model calls a sample
    (None: no call budget), and the CD fallback with ``fallback_tries`` walks a sample
    (None: no fallback; a spent budget is the request's error).

    Where a method's samples are independent, each sample's walk has its own ``share`` of
    model rows and hands over alone past it; where n > 1 samples share one Q, the first is
    due within (n + 1) / 2 shares and the request's whole budget applies once it came.
    """

    def __init__(self, *, sample_calls: float | None = None, n: int = 1,
                 fallback_tries: int | None = None, early: float | None = None) -> None:
        self.sample_calls, self.n, self.fallback_tries = sample_calls, n, fallback_tries
        #: The early hand-over's ratio to CD's estimated cost (None: only the budget).
        self.early = early if fallback_tries is not None else None
        self._need = 1  # the fewest tokens a valid text takes (the constraint's bound)
        self._used = 0  # prefixes the request's walks used (their ``seen``)
        self._used_done = 0  # those of the walks that finished
        self._drawn = 0  # samples the search drew
        self._finished: list[int] = []  # the calls to each finished sample, whoever drew it
        self._paths: float | None = None  # calls to the first _need tokens of the walks' paths
        #: Model rows each sample's walk may cause (``Request.share``), or None.
        self.share: int | None = None
        self._held: int | None = None  # the whole call budget, while the first sample is due
        self._cd: ConstrainedDecoding | None = None  # the walks of samples past their share
        #: False once the fallback took the whole request over.
        self.searching = True

    @classmethod
    def for_search(cls, search_budget: float | None, max_new_tokens: int, n: int, *,
                   fallback_tries: int | None,
                   early: float | None = EARLY_RATIO) -> BudgetPolicy:
        """The policy of a search of ``n`` samples: ``search_budget`` x ``max_new_tokens``
        model calls a sample, the tokens counted as at least :data:`SEARCH_TOKENS` (None:
        no call budget), handing over early at ``early`` x CD's estimated cost
        (:meth:`early_calls`; None: only the budget; no call budget, no early hand-over).

        >>> BudgetPolicy.for_search(3.0, 10, 2, fallback_tries=4).max_calls   # 3 x 64 x 2
        384
        """
        share = None if search_budget is None else search_budget * max(max_new_tokens,
                                                                        SEARCH_TOKENS)
        return cls(sample_calls=share, n=n, fallback_tries=fallback_tries,
                   early=None if share is None else early)

    @staticmethod
    def request_calls(sample_calls: float | None, n: int) -> int | None:
        """The model calls a request of ``n`` samples may make: ``n`` shares (at least 1)."""
        return None if sample_calls is None else max(1, math.ceil(sample_calls * n))

    @property
    def max_calls(self) -> int | None:
        """The request's call budget (:meth:`request_calls`)."""
        return self.request_calls(self.sample_calls, self.n)

    @property
    def falls_back(self) -> bool:
        return self.fallback_tries is not None

    def bind(self, tree: PrefixTree) -> None:
        """Give ``tree`` the request's call budget on top of the calls it already made (a
        tree reused from an earlier call); over a lazy constraint, no early hand-over."""
        calls = self.max_calls
        tree.max_calls = None if calls is None else tree.lm_calls + calls
        self._need = max(1, int(getattr(tree.matcher, "min_new_tokens", lambda: 1)()))
        if tree.matcher.lazy:
            # A lazy constraint (a predicate, python()) tells CD no dead end ahead: CD's
            # samples there are often incomplete, so the search keeps its whole budget.
            self.early = None

    def start(self, method: Method) -> None:
        """The request starts: with the fallback, a sample's share replaces the request's
        budget where samples are independent (one walk that crawls no longer spends the
        others' calls); where n > 1 share one Q, the first sample is due within (n + 1) / 2
        shares (docs/design.md §6)."""
        tree, calls = method.tree, self.sample_calls
        if not self.falls_back or calls is None:
            return
        if method.independent:
            self.share, tree.max_calls = max(1, math.ceil(calls)), None
        elif self.n > 1 and tree.max_calls is not None:
            self._held = held = tree.max_calls
            whole = self.max_calls
            assert whole is not None
            tree.max_calls = held - whole + math.ceil(calls * (self.n + 1) / 2)
            tree.budgets.calls_rule = FIRST_SAMPLE_RULE

    def sample_done(self, tree: PrefixTree, fell: bool, node: Node | None = None,
                    used: int = 0) -> None:
        """A sample finished at ``node`` (``fell``: the fallback drew it), its walk having
        used ``used`` prefixes: the first the method drew gives the request its whole budget
        back."""
        self._used_done += used
        if node is not None:
            self._finished.append(tree.calls_to(node))
        self._drawn += not fell
        if self._held is not None and not fell and tree.max_calls is not None:
            tree.max_calls, self._held = self._held, None
            tree.budgets.calls_rule = CALLS_RULE

    def check(self, tree: PrefixTree) -> None:
        """Before each of the request's model calls: the ``SearchLimitError`` of a spent
        budget, which hands the request over (:meth:`hands_over`); while the search runs,
        that of :meth:`check_search` too."""
        tree.check_spent()
        if self.searching:
            self.check_search(tree)

    def cd_calls(self) -> float:
        """CD's estimated model calls for one sample of the request: the larger of the
        calls to write as many tokens as the constraint's bound says a text takes, and the
        calls to the samples that finished, on average (``PrefixTree.calls_to``; those the
        fallback drew are CD's own). The first counts a call a token until the walks'
        paths say how many of their first tokens fast-forward gave for free
        (:meth:`walked`). None of these depends on what an earlier request left in a reused
        tree, so neither does the hand-over.

        >>> import adaptrack as at
        >>> lm = at.TableLM([b"a", b"b", b"<eos>"], lambda prefix: [1, 1, 1], eos=2)
        >>> tree = PrefixTree([], at.constraints.choice(["aaaa"]).bind(lm.vocab))
        >>> policy = BudgetPolicy(fallback_tries=4, early=2.0); policy.bind(tree)
        >>> policy.cd_calls()    # a a a a <eos>
        5.0
        """
        done = self._finished
        need = self._need if self._paths is None else self._paths
        return float(max(1.0, need, sum(done) / len(done) if done else 0))

    def reads_paths(self, used: int) -> bool:
        """Whether the engine should tell :meth:`walked` the walks' paths, the request's
        walks having used ``used`` prefixes: only once an early hand-over could come."""
        return self.early is not None and used >= EARLY_FLOOR

    def walked(self, nodes: list[Node]) -> None:
        """The searching walks wait at ``nodes``: a call for each of the first tokens of
        their paths that fast-forward did not feed, on average, is what CD's sample pays
        for the tokens the bound says any text takes (JSON keys and separators a schema
        forces cost tokens, but no calls)."""
        if nodes:
            self._paths = sum(PrefixTree.calls_within(n, self._need) for n in nodes) / len(nodes)

    def early_calls(self) -> int | None:
        """The prefixes a sample's search may use before the early hand-over (None: no
        early hand-over): :data:`EARLY_RATIO` x :meth:`cd_calls`, at least
        :data:`EARLY_FLOOR`."""
        if self.early is None:
            return None
        return max(EARLY_FLOOR, math.ceil(self.early * self.cd_calls()))

    def used(self, in_flight: int) -> None:
        """The engine says how many prefixes the request's walks in flight have used (the
        paper's LM calls: each walk's ``seen``); with the finished walks' (:meth:`sample_done`)
        that is what the early hand-over of a shared Q charges: unlike the model rows, the
        same whatever a reused tree had cached."""
        self._used = self._used_done + in_flight

    def check_search(self, tree: PrefixTree) -> None:
        """The early hand-over of samples that share one Q: once the search used
        :meth:`early_calls` prefixes a sample for each of the ``n``, it hands the request
        over unless the samples it drew say the rest come within one more CD's cost (the
        rate at which it draws them). Independent samples hand over one by one
        (:meth:`past_share`)."""
        early = self.early_calls()
        if early is None or self.early is None or self.share is not None:
            return
        spent, drawn = self._used, self._drawn
        if spent < early * self.n:
            return
        cd = self.cd_calls() * self.n
        if drawn and spent * self.n / drawn <= (self.early + 1) * cd:
            return
        raise EarlyHandover(
            f"the search used {spent} prefixes and drew {drawn} of {self.n} samples, "
            f"past {self.early:g} x CD's estimated cost ({math.ceil(cd)} calls); CD draws "
            "the rest (early_handover; None to search on to the budget)")

    def past_share(self, rows: int, used: int | None = None) -> CallLimitError | None:
        """Why a sample's walk that caused ``rows`` model rows and used ``used`` prefixes
        (its ``seen``), and needs one more row, hands over to the fallback, or None while it
        may go on: its share of the budget in rows, or the early hand-over in prefixes used
        (:meth:`early_calls`)."""
        if self.share is None:
            return None
        early = None if used is None else self.early_calls()
        if used is not None and early is not None and early < self.share and used >= early:
            return EarlyHandover(
                f"a sample's walk used {used} prefixes, {self.early:g} x CD's estimated "
                f"cost of a sample ({math.ceil(self.cd_calls())} calls); CD draws it "
                "(early_handover; None to search on to the budget)")
        if rows < self.share:
            return None
        return CallLimitError(
            f"a sample's walk made {rows} model calls, its share of the budget "
            f"(search_budget x max_new_tokens, {self.share} a sample); raise "
            "search_budget (None for no limit)")

    @staticmethod
    def resumes(why: BaseException) -> bool:
        """Whether the fallback's walk of a sample goes on from where its search's walk
        reached (a spent budget: mostly near the length limit, a few calls from an end) or
        starts at the root (the early hand-over: a walk that wandered where CD would not go,
        often deep in a string the model would not write, where finishing costs far more
        than a CD sample and gives a text no sampler would)."""
        return not isinstance(why, EarlyHandover)

    def fallback(self, method: Method) -> ConstrainedDecoding:
        """The CD that draws a sample past its share, on ``method``'s tree (one for the
        request)."""
        if self._cd is None:
            self._cd = self._new_cd(method)
        return self._cd

    def hands_over(self, err: BaseException) -> bool:
        """Whether ``err`` hands the whole request to the fallback: a spent search budget
        (not a constraint check's timeout, which CD would meet again)."""
        return (self.falls_back and isinstance(err, SearchLimitError)
                and not isinstance(err, CheckTimeoutError))

    def take_over(self, method: Method, walks: int) -> ConstrainedDecoding:
        """The CD that draws the request's missing samples, ``walks`` of them from the root
        or where a walk had reached. Its own bound applies: at most WALK_STEPS x
        (max_new_tokens + 1) prefixes a walk, ``tries`` walks each; the search's budgets,
        spent, no longer apply to the tree."""
        cd, tree = self._new_cd(method), method.tree
        self.searching = False
        tree.max_seconds = tree.max_calls = None
        tree.max_nodes = max(tree.max_nodes, tree.num_nodes
                             + walks * cd.tries * WALK_STEPS * (tree.max_new_tokens + 1))
        return cd

    @staticmethod
    def walk_from(method: Method, seen: set[int], rng: np.random.Generator,
                  start: Node) -> Walk:
        """The fallback's walk of a sample from ``start``, where its search's walk had
        reached (``method``: a fallback this policy made)."""
        return cast(ConstrainedDecoding, method).walk(seen, rng, start=start)

    def _new_cd(self, method: Method) -> ConstrainedDecoding:
        assert self.fallback_tries is not None
        return ConstrainedDecoding(method.tree, method.greedy, tries=self.fallback_tries,
                                   canonical=True)
